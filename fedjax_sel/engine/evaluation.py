"""The global model's metrics: pooled over every client's examples of a split, across the clients,
over the `eval_mask` clients (`clean_*`), and on the server's public set.

One pooling serves the device placement (every client at once) and the host placement (clients
streamed in chunks, `placement.py`).

Example:
  >>> import jax.numpy as jnp
  >>> from fedjax_sel.client.evaluation import ClientMetrics
  >>> m = ClientMetrics(*(jnp.array(v) for v in ([1.0, 0.5], [0.5, 1.0], [0.0, 0.0], [2.0, 0.0])))
  >>> round(float(client_spread(m)["mean"]), 2)
  0.5
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_sel.client.evaluation import client_metrics
from fedjax_sel.engine.description import RoundConfig
from fedjax_sel.engine.signature import signature
from fedjax_sel.engine.state import DataArrays
from fedjax_sel.models.bundle import Model, example_metrics


def evaluate(config: RoundConfig, params, arrays: DataArrays) -> dict:
  """Global model metrics: pooled test and train loss / accuracy (and over `eval_mask`), the
  clients' validation split's when they hold one (what a tuned setting is chosen on, never the
  test split), and on the public set when there is one."""
  splits = [("test", arrays.test), ("train", arrays.train)]
  if arrays.val.y.shape[0]:  # Static: the data have a validation split.
    splits.append(("val", arrays.val))
  per_split = {split: client_metrics(config.model, params, pool, config.eval_batch_size)
               for split, pool in splits}
  out = pooled_metrics(config, per_split, arrays.eval_mask)
  if arrays.public_y.shape[0]:
    out.update(public_metrics(config.model, params, arrays.public_x, arrays.public_y))
  return out


def evaluation_key(config: RoundConfig):
  """The structural signature of what the evaluation reads of a config: the model, the evaluation
  batch size and whether the clean metrics are on. The methods of a job that evaluate one model
  alike, whatever their selector, filter, rule or aggregator, then trace and compile one
  evaluation (a job's 19 selectors one, not 19)."""
  return signature((config.model._replace(init=None), config.eval_batch_size,
                    config.clean_metrics))


def pooled_metrics(config: RoundConfig, per_split: dict, eval_mask) -> dict:
  """`{split}_loss` / `{split}_accuracy` pooled over every client's examples of each split's
  `ClientMetrics` (and `clean_...` over the `eval_mask` clients)."""
  out = {}
  for split, m in per_split.items():
    out[f"{split}_loss"], out[f"{split}_accuracy"] = m.pooled()
    if config.clean_metrics:
      clean = m._replace(count=jnp.where(eval_mask, m.count, 0.0))
      out[f"clean_{split}_loss"], out[f"clean_{split}_accuracy"] = clean.pooled()
  if "test" in per_split:
    out["client_test_accuracy"] = client_spread(per_split["test"])
  return out


def client_spread(m) -> dict:
  """The global model's accuracy across the clients that hold examples of a split (each client's
  own accuracy, unweighted): mean, 10th percentile, worst and std."""
  acc = jnp.where(m.count > 0, m.accuracy, jnp.nan)
  return {"mean": jnp.nanmean(acc), "p10": jnp.nanpercentile(acc, 10.0), "worst": jnp.nanmin(acc),
          "std": jnp.nanstd(acc)}


def public_metrics(model: Model, params, x, y) -> dict:
  """Loss and accuracy of the global model on the server's public set."""
  m = example_metrics(model, params, x, y)
  return {"public_loss": jnp.mean(m.loss), "public_accuracy": jnp.mean(m.correct)}
