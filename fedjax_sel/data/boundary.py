"""UACS-FL's 2-D boundary data (docs/papers/uacs.md): few clients near the decision boundary, many
far.

Binary labels come from a true line a*x1 + b*x2 + c = 0 (label 1 on the positive side) in the
square [-domain, domain]^2. Of the N clients, `num_boundary` hold points near the line with both
labels; every other ("far") client holds points of a single class (classes alternate over clients)
at a distance of at least `gap0` (class 0) or `gap1` (class 1) from the line. What each scenario
draws (every draw comes from one seeded generator):

1. Boundary clients in boxes: each boundary client draws a centre uniformly on the segment of the
   line inside the square and its points uniformly in a `box_size` square around it. Far clients
   draw uniformly over their class's region (the square minus the gap).
2. Boundary clients along the whole line: each draws points uniformly along the whole segment,
   shifted across the line by up to `band` either way. Far clients as in 1.
3. Like 1, and each far client is confined to one `region_size` square whose centre is drawn from
   its class's region (the whole square stays outside the gap).

The test set draws `test_samples` points uniformly over the square, labelled by the line, so test
accuracy measures how much of the square the learned boundary classifies right.

Gaps: with equal gaps (gap0 == gap1) the far clients alone already place a max-margin boundary on
the true line, and no selector can help. The default gaps are unequal (0.05 and 0.5): trained on the
far clients alone a linear model settles between the two classes' gaps, shifted off the true line,
and only the boundary clients' points pull it back. This is the paper's regime; pass equal gaps for
the other. Scenario 3 adds a second reason: far regions admit many separating lines.

Examples:
  >>> data, is_boundary = boundary_dataset(BoundaryConfig(num_clients=10, num_boundary=2,
  ...                                                     samples_per_client=5), seed=0)
  >>> data.num_clients, int(is_boundary.sum()), data.feature_shape
  (10, 2, (2,))
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedjax_sel import registry
from fedjax_sel.data.federated import ClientPool, FederatedDataset, label_histogram
from fedjax_sel.registry import SettingError

SCENARIOS = (1, 2, 3)


@dataclasses.dataclass(frozen=True)
class BoundaryShape:
  """The boundary data's counts, gaps and boxes, each with its help text and range (the UACS-FL
  launcher's flags of the same names)."""

  num_boundary: int = registry.setting(6, "Boundary clients (holding points near the decision "
                                       "boundary; at most N).", within=">= 0")
  samples_per_client: int = registry.setting(50, "Points of each far client (one class, away "
                                             "from the boundary).", within=">= 1")
  boundary_samples: int = registry.setting(50, "Points of each boundary client (near the true "
                                           "boundary, both labels).", within=">= 1")
  gap0: float = registry.setting(0.05, "Minimum distance of far class-0 points to the true "
                                 "boundary (below the domain).", within=">= 0")
  gap1: float = registry.setting(0.5, "Minimum distance of far class-1 points to the true "
                                 "boundary (equal gaps: the far clients alone place the boundary "
                                 "right).", within=">= 0")
  box_size: float = registry.setting(0.25, "Side of a boundary client's box (scenarios 1, 3).",
                                     within="> 0")
  band: float = registry.setting(0.1, "Half-width across the boundary of scenario 2's boundary "
                                 "points.", within="> 0")
  region_size: float = registry.setting(0.2, "Side of a far client's square (scenario 3).",
                                        within="> 0")
  test_samples: int = registry.setting(4000, "Test points drawn uniformly over the square.",
                                       within=">= 1")


@dataclasses.dataclass(frozen=True)
class BoundaryConfig(BoundaryShape):
  """The whole boundary data (see the module docstring): its `BoundaryShape` and

  Attributes:
    scenario: 1, 2 or 3.
    num_clients: N.
    line: (a, b, c) of the true boundary a*x1 + b*x2 + c = 0.
    domain: points lie in [-domain, domain]^2.
  """

  scenario: int = 1
  num_clients: int = 100
  line: tuple[float, float, float] = (0.6, -1.0, 0.1)
  domain: float = 1.0


def check_config(cfg: BoundaryConfig) -> None:
  """Raises `registry.SettingError` naming the bad field and its accepted range, before any
  compute."""
  registry.check_values(cfg)
  if cfg.scenario not in SCENARIOS:
    raise SettingError("scenario", f"must be one of {SCENARIOS}, got {cfg.scenario}")
  if cfg.num_clients < 1:
    raise SettingError("num_clients", f"must be >= 1, got {cfg.num_clients}")
  if not cfg.domain > 0:
    raise SettingError("domain", f"must be > 0, got {cfg.domain}")
  if cfg.num_boundary > cfg.num_clients:
    raise SettingError("num_boundary", f"must be in 0..{cfg.num_clients} (num_clients), got "
                       f"{cfg.num_boundary}")
  for name in ("gap0", "gap1"):
    if not getattr(cfg, name) < cfg.domain:
      raise SettingError(name, f"must be in [0, {cfg.domain}) (domain), got "
                         f"{getattr(cfg, name)}")
  a, b, _ = cfg.line
  if a == 0 and b == 0:
    raise SettingError("line", "(a, b, c) needs a or b non-zero")


def signed_distance(x: np.ndarray, line) -> np.ndarray:
  """Signed distance of points `[n, 2]` to the line (positive on the label-1 side)."""
  a, b, c = line
  return (a * x[:, 0] + b * x[:, 1] + c) / np.hypot(a, b)


def _segment(cfg: BoundaryConfig, rng, n: int) -> np.ndarray:
  """n points uniform on the part of the line inside the square."""
  a, b, c = cfg.line
  d = cfg.domain
  t = np.linspace(-d, d, 2001)
  if abs(b) >= abs(a):
    pts = np.stack([t, -(a * t + c) / b], axis=1)
  else:
    pts = np.stack([-(b * t + c) / a, t], axis=1)
  inside = pts[(np.abs(pts) <= d).all(axis=1)]
  if not len(inside):
    raise ValueError(f"line {cfg.line} does not cross the square [-{d}, {d}]^2")
  lo, hi = inside[0], inside[-1]
  return lo + rng.uniform(0, 1, (n, 1)) * (hi - lo)


def _rejection(rng, n: int, draw, keep) -> np.ndarray:
  out = np.zeros((0, 2))
  for _ in range(10000):
    cand = draw(max(4 * n, 64))
    out = np.concatenate([out, cand[keep(cand)]])
    if len(out) >= n:
      return out[:n]
  raise ValueError("could not draw points in the requested region; lower the gaps or sizes")


def boundary_clients(cfg: BoundaryConfig, seed: int):
  """Per-client points and labels.

  Returns:
    (xs, ys, is_boundary): lists of `[n_k, 2]` float32 and `[n_k]` int32 arrays, and the `[N]` bool
    mask of boundary clients (the first `num_boundary` ids after a seeded shuffle).
  """
  check_config(cfg)
  rng = np.random.default_rng(seed)
  d, normal = cfg.domain, np.array(cfg.line[:2]) / np.hypot(*cfg.line[:2])
  is_boundary = np.zeros(cfg.num_clients, bool)
  is_boundary[rng.permutation(cfg.num_clients)[:cfg.num_boundary]] = True
  label = lambda x: (signed_distance(x, cfg.line) > 0).astype(np.int32)
  uniform = lambda k: rng.uniform(-d, d, (k, 2))
  xs, ys = [], []
  far_index = 0
  for k in range(cfg.num_clients):
    if is_boundary[k]:
      if cfg.scenario == 2:
        x = (_segment(cfg, rng, cfg.boundary_samples)
             + rng.uniform(-cfg.band, cfg.band, (cfg.boundary_samples, 1)) * normal)
      else:
        centre = _segment(cfg, rng, 1)
        x = centre + rng.uniform(-cfg.box_size / 2, cfg.box_size / 2, (cfg.boundary_samples, 2))
      x = np.clip(x, -d, d)
    else:
      cls = far_index % 2
      far_index += 1
      sign, gap = (1.0, cfg.gap1) if cls == 1 else (-1.0, cfg.gap0)
      side = lambda p, g=gap, s=sign: s * signed_distance(p, cfg.line) >= g
      if cfg.scenario == 3:
        half = cfg.region_size / 2
        centre = _rejection(rng, 1, lambda m: rng.uniform(-d + half, d - half, (m, 2)),
                            lambda p, g=gap + half * np.sqrt(2), s=sign:
                            s * signed_distance(p, cfg.line) >= g)
        x = centre + rng.uniform(-half, half, (cfg.samples_per_client, 2))
      else:
        x = _rejection(rng, cfg.samples_per_client, uniform, side)
    xs.append(x.astype(np.float32))
    ys.append(label(x))
  return xs, ys, is_boundary


def boundary_dataset(cfg: BoundaryConfig, seed: int) -> tuple[FederatedDataset, np.ndarray]:
  """The federated dataset: clients' points as training data, the uniform test set dealt
  round-robin over the clients' test splits (so the pooled test accuracy is the accuracy on the
  whole test set), no validation or public data.

  Returns:
    (dataset, `[N]` bool mask of boundary clients).
  """
  xs, ys, is_boundary = boundary_clients(cfg, seed)
  rng = np.random.default_rng(seed + 1)
  tx = rng.uniform(-cfg.domain, cfg.domain, (cfg.test_samples, 2)).astype(np.float32)
  ty = (signed_distance(tx, cfg.line) > 0).astype(np.int32)
  owner = np.arange(cfg.test_samples) % cfg.num_clients
  n = cfg.num_clients
  train = ClientPool.from_client_arrays(xs, ys)
  test = ClientPool.from_client_arrays([tx[owner == k] for k in range(n)],
                                       [ty[owner == k] for k in range(n)])
  val = ClientPool.from_client_arrays([np.zeros((0, 2), np.float32)] * n,
                                      [np.zeros((0,), np.int32)] * n)
  data = FederatedDataset(train=train, val=val, test=test, public_x=np.zeros((0, 2), np.float32),
                          public_y=np.zeros((0,), np.int32), num_classes=2,
                          label_hist=label_histogram(train, 2),
                          name=f"boundary/scenario{cfg.scenario}")
  return data, is_boundary
