"""A dataset defined outside the package, as a researcher would add one: registered on import, run
by `experiments.run --dataset=tests.toy_dataset:two_blobs` (test_replay.py)."""

import dataclasses

import numpy as np

from fedjax_sel import registry
from fedjax_sel.data import sources
from fedjax_sel.data.builders import NamedDataset


@dataclasses.dataclass(frozen=True)
class TwoBlobsSettings:
  """Settings of the toy dataset."""

  blob_gap: float = registry.setting(4.0, "Distance between the two classes' means.")


@registry.register("dataset", "two_blobs", TwoBlobsSettings)
def two_blobs(settings: TwoBlobsSettings, context: registry.BuildContext) -> NamedDataset:
  """600 2-D points in two Gaussian classes `blob_gap` apart (a centralized pool)."""
  del context

  def load(spec, seed):
    del spec
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 600).astype(np.int32)
    x = (rng.normal(size=(600, 2)) + settings.blob_gap * y[:, None]).astype(np.float32)
    return sources.Centralized(x, y, 2)
  return NamedDataset(load)
