"""A plain event-driven reference of asynchronous FL, written from the papers: FedBuff (Nguyen et
al., AISTATS 2022, Algorithm 1) and FedAsync (Xie et al., 2019, Algorithm 1), with FedScale's and
FLSim's discarding of updates staler than a bound.

The server keeps C clients training at once. Events pop from a Python heap in (finish time,
client id) order. On each event the client's slot is freed: a client that is not available at its
finish time's availability index went away (dropped), an update staler than the bound is
discarded; any other update joins the buffer, and on the buffer's K-th update the server steps
(FedBuff: `w + sum_i p_i s_i delta_i`; FedAsync: `w + alpha mean(s) (x - w)`, x the arrived
models' weighted mean). Then every free slot is refilled at that event's time, from the clients
available then and not in flight, each trained from the server's model at that moment (after the
step, when there was one). Local training, the selection rule and the clock are callbacks (the
test passes the library's per-client training, a deterministic selector and the clock's
durations); availability is an input. Simulated seconds are float32, as the engine keeps them.
"""

from __future__ import annotations

import heapq

import numpy as np


def staleness(kind: str, tau: int, a: float, b: float) -> float:
  if kind == "constant":
    return 1.0
  if kind == "polynomial":
    return float((1.0 + tau) ** (-a))
  return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def simulate(*, params, steps, k, concurrency, rule, kind, a, b, alpha, window_s, max_staleness,
             available, choose, train, duration, num_examples):
  """Runs until `steps` server steps happened.

  Args:
    params: the initial model, a list of float64 arrays.
    available: `window -> [N] bool`.
    choose: `(t, j, candidates [N] bool) -> client id`, the selection rule (one client per
      dispatch; j counts the dispatches since server step t began).
    train: `(t, client, occurrence, params) -> local model`; occurrence counts the client's
      earlier dispatches since server step t began.
    duration: `client -> float32 seconds`.
    num_examples: `[N]` training examples (FedAvg's weights).

  Returns:
    (per-step records {arrivals: ids in arrival order, staleness: in arrival order, dropped,
    stale_dropped, dispatched: ids in dispatch order, now}, final model).
  """
  w = [np.asarray(p, np.float64) for p in params]
  n = len(num_examples)
  now, t = np.float32(0.0), 0
  heap = []  # (finish, client, version, update, start)
  buffer, dropped, stale, dispatched, occurrences = [], 0, 0, [], {}
  records = []

  def window(seconds):
    return int(np.floor(np.float32(seconds) / np.float32(window_s)))

  def refill():
    avail = np.asarray(available(window(now)))
    while len(heap) < concurrency:
      in_flight = np.zeros(n, bool)
      in_flight[[e[1] for e in heap]] = True
      candidates = avail & ~in_flight
      if not candidates.any():
        return
      c = int(choose(t, len(dispatched), candidates))
      occurrence = occurrences.get(c, 0)
      occurrences[c] = occurrence + 1
      local = train(t, c, occurrence, w)
      update = local if rule == "fedasync" else [x - g for x, g in zip(local, w)]
      heapq.heappush(heap, (float(np.float32(now + np.float32(duration(c)))), c, t, update,
                            float(now)))
      dispatched.append(c)

  refill()
  while len(records) < steps and heap:
    finish, c, version, update, _ = heapq.heappop(heap)
    now = np.float32(max(float(now), finish))
    if not available(window(finish))[c]:
      dropped += 1
    elif max_staleness is not None and t - version > max_staleness:
      stale += 1
    else:
      buffer.append((c, t - version, update))
      if len(buffer) == k:
        m = np.array([num_examples[i] for i, _, _ in buffer], np.float64)
        p = m / m.sum()
        s = np.array([staleness(kind, tau, a, b) for _, tau, _ in buffer])
        if rule == "fedbuff":
          w = [g + sum(pi * si * u[i] for pi, si, (_, _, u) in zip(p, s, buffer))
               for i, g in enumerate(w)]
        else:
          mixing = alpha * s.mean()
          x = [sum(pi * u[i] for pi, (_, _, u) in zip(p, buffer)) for i in range(len(w))]
          w = [(1 - mixing) * g + mixing * xi for g, xi in zip(w, x)]
        records.append({"arrivals": [i for i, _, _ in buffer],
                        "staleness": [tau for _, tau, _ in buffer], "dropped": dropped,
                        "stale_dropped": stale, "dispatched": dispatched, "now": float(now)})
        t += 1
        buffer, dropped, stale, dispatched, occurrences = [], 0, 0, [], {}
    refill()
  return records, w
