"""AFL as Plato implements it (TL-System/plato,
examples/client_selection/afl/afl_selection_strategy.py @3f29ca2c and afl_server.py @54bce6a4,
the version whose docs say it matches Algorithm 1 of Goetz et al. 2019): the probability step of
`AFLSelectionStrategy._calc_sample_distribution` and the candidates of `select_clients`.

Plato keeps a dict of valuations in first-seen order; with every client of the pool known, in id
order, its stable sort leaves the lowest `int(alpha1 * len(pool))` valuations out (-inf ones
first), then `exp(alpha2 * v)` normalized over the clients with a finite valuation.
"""

import math

NEG_INF = -float("inf")


def round_probabilities(valuations, alpha1=0.75, alpha2=0.01):
  """`valuations`: a list, client i's valuation at i (-inf if never valued); the pool is every
  client. Returns the list of draw probabilities (0 for the clients left out)."""
  pool = list(range(len(valuations)))
  values = {c: {"valuation": valuations[c], "prob": 0.0} for c in pool}
  num_smallest = int(alpha1 * len(pool))
  smallest = sorted(values.items(), key=lambda item: item[1]["valuation"])[:num_smallest]
  for cid, _ in smallest:
    values[cid]["valuation"] = NEG_INF
  for cid in pool:
    v = values[cid]["valuation"]
    values[cid]["prob"] = 0.0 if v == NEG_INF else math.exp(alpha2 * v)
  total = sum(values[c]["prob"] for c in pool)
  if total > 0:
    for c in pool:
      values[c]["prob"] /= total
  return [values[c]["prob"] for c in pool]


def valuation(num_samples, mean_loss, paper=True):
  """afl_client.py:Client.calc_valuation is `mean_loss / sqrt(n)` (Plato); the paper's
  `L(D_k) / sqrt(n)` with the summed loss L is `sqrt(n) * mean_loss`."""
  return math.sqrt(num_samples) * mean_loss if paper else mean_loss / math.sqrt(num_samples)
