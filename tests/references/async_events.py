"""A plain event-driven reference of asynchronous FL, written from the papers: FedBuff (Nguyen et
al., AISTATS 2022, Algorithm 1: the server buffers K client deltas, each weighted by
s(staleness), then steps) and FedAsync (Xie et al., 2019, Algorithm 1: each arriving model x is
mixed in as w <- (1 - alpha_t) w + alpha_t x, alpha_t = alpha s(t - tau)).

A Python heap of (finish time, client id) events; NumPy float64 models. What it shares with the
engine is what the mode specifies, not how it computes it: a server step t refills the free slots
at the step's time (each call of the selector chooses up to K among the available clients not in
flight; of a call choosing more than the free slots, those with the lowest uniform draws of the
call's key), each dispatched client trains from w_t and finishes at now + its clock time (float32,
as simulated seconds are kept); events pop in (finish, client id) order; a client unavailable at
its finish time's availability index is dropped; the step ends at its K-th arrival.
Local training and the selector are callbacks (the test passes the library's per-client training
and a deterministic selector), and the availability model and clock profile are inputs.
"""

from __future__ import annotations

import heapq

import jax
import numpy as np

SELECT, REFILL = 3, 1  # fedjax_sel.keys.SELECT; the engine's REFILL fold.


def staleness(kind: str, tau: int, a: float, b: float) -> float:
  if kind == "constant":
    return 1.0
  if kind == "polynomial":
    return float((1.0 + tau) ** (-a))
  return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def call_key(seed: int, t: int, j: int):
  base = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), t), SELECT)
  return base if j == 0 else jax.random.fold_in(jax.random.fold_in(base, REFILL), j)


def simulate(*, params, steps, k, concurrency, rule, kind, a, b, alpha, window_s, seed,
             available, choose, train, duration, num_examples):
  """Runs `steps` server steps.

  Args:
    params: the initial model, a list of float64 arrays.
    available: `window -> [N] bool`.
    choose: `(t, candidates [N] bool) -> [N] bool` the selector's choice (at most K).
    train: `(t, client, params) -> (local model, samples)`.
    duration: `(client, samples) -> float32 seconds`.
    num_examples: `[N]` training examples (FedAvg's weights).

  Returns:
    (per-step records {arrived: sorted ids, staleness: by id, dropped, now}, final model).
  """
  w = [np.asarray(p, np.float64) for p in params]
  now = np.float32(0.0)
  heap, records = [], []  # (finish, client, version, update)
  n = len(num_examples)
  for t in range(steps):
    # Refill at the step's time, from w_t.
    window = int(np.floor(np.float32(now) / np.float32(window_s)))
    avail = np.asarray(available(window))
    for j in range(-(-concurrency // k)):
      in_flight = np.zeros(n, bool)
      in_flight[[e[1] for e in heap]] = True
      candidates = avail & ~in_flight
      room = concurrency - len(heap)
      if room == 0 or not candidates.any():
        break
      chosen = np.asarray(choose(t, candidates)) & candidates
      if chosen.sum() > room:
        u = np.asarray(jax.random.uniform(jax.random.fold_in(call_key(seed, t, j), SELECT), (n,)))
        ids = np.flatnonzero(chosen)
        keep = ids[np.argsort(u[ids], kind="stable")[:room]]
        chosen = np.zeros(n, bool)
        chosen[keep] = True
      for c in np.flatnonzero(chosen):
        local, samples = train(t, int(c), w)
        update = local if rule == "fedasync" else [x - g for x, g in zip(local, w)]
        finish = np.float32(now + np.float32(duration(int(c), samples)))
        heapq.heappush(heap, (float(finish), int(c), t, update))
    # Events until the K-th arrival.
    arrived, dropped = [], 0
    while heap and len(arrived) < k:
      finish, c, version, update = heapq.heappop(heap)
      now = np.float32(max(float(now), finish))
      if available(int(np.floor(np.float32(finish) / np.float32(window_s))))[c]:
        arrived.append((c, t - version, update))
      else:
        dropped += 1
    if arrived:
      m = np.array([num_examples[c] for c, _, _ in arrived], np.float64)
      p = m / m.sum()
      s = np.array([staleness(kind, tau, a, b) for _, tau, _ in arrived])
      if rule == "fedbuff":  # w + sum_i p_i s_i delta_i.
        w = [g + sum(pi * si * u[i] for pi, si, (_, _, u) in zip(p, s, arrived))
             for i, g in enumerate(w)]
      else:  # FedAsync: x = the arrived models' FedAvg; alpha_t = alpha * mean s.
        mixing = alpha * s.mean()
        x = [sum(pi * u[i] for pi, (_, _, u) in zip(p, arrived)) for i in range(len(w))]
        w = [(1 - mixing) * g + mixing * xi for g, xi in zip(w, x)]
    records.append({"arrived": sorted(c for c, _, _ in arrived),
                    "staleness": [tau for _, tau, _ in sorted(arrived, key=lambda e: e[0])],
                    "dropped": dropped, "now": float(now)})
  return records, w
