"""TiFL as FLGo and fltk write it (no authors' code exists): tiering (bacox/fltk @f67f7378,
fltk/strategy/client_selection/tifl.py: create_tiers; WwZzz/easyFL @ea07f1d0,
flgo/algorithm/TiFL.py: Server.profiling_and_tiering) and ChangeProbs (TiFL.py:
Server.change_probs; tifl.py: change_probs)."""

import math
from collections.abc import Sequence

import numpy as np


def tifl_tiers(latencies: Sequence[float], num_tiers: int = 5, variant: str = "flgo"):
    """Group clients into tiers by profiled latency (fastest tier first).

    flgo : TiFL.py:Server.profiling_and_tiering
           ordered_cids = np.argsort(client_latencies)       # default kind: NOT stable on ties
           groups = np.split(ordered_cids, self.T)           # ValueError unless N % T == 0
           group_latency = [latencies[group].mean() ...]
    fltk : tifl.py:create_tiers
           sorted_clients = sorted(profiling_data, key=latency)   # stable
           chunk_size = ceil(N / num_tiers); consecutive chunks -> tier 0,1,...
           (can yield FEWER than num_tiers non-empty tiers, e.g. N=9, T=4 -> 3,3,3,[] ;
            the empty tier still exists with credits/prob)
    Returns (list of np.ndarray of client indices per tier, np.ndarray mean latency per tier
    (nan for an empty tier)).
    """
    lat = np.asarray(latencies, dtype=float)
    if variant == "flgo":
        ordered = np.argsort(list(latencies))
        groups = np.split(ordered, num_tiers)
    else:
        order = sorted(range(len(lat)), key=lambda i: lat[i])
        chunk = math.ceil(len(order) / num_tiers)
        chunks = [order[i:i + chunk] for i in range(0, len(order), chunk)]
        groups = [np.array(chunks[t], dtype=int) if t < len(chunks) else np.array([], dtype=int)
                  for t in range(num_tiers)]
    ave = np.array([lat[g].mean() if len(g) else np.nan for g in groups])
    return groups, ave


# ---------------------------------------------------------------------------
# Credits
# ---------------------------------------------------------------------------


def tifl_tier_probabilities(tier_accuracies: Sequence[float], credits: Sequence[float],
                            variant: str = "flgo") -> np.ndarray:
    """ChangeProbs.  n = #tiers with credit > 0, D = n(n+1)/2.  Tiers sorted by accuracy
    ASCENDING; walking that order, a tier with credit gets (n - (idx - idx_decr)) / D and a
    tier without credit gets 0 (and shifts the rank of the following ones).  So the lowest-
    accuracy tier with credits gets n/D, the next (n-1)/D, ..., the best 1/D; sums to 1.

    flgo : TiFL.py:Server.change_probs  -- order = np.argsort(tier_accs) (quicksort; tie order
           not guaranteed stable), exact fractions.
    fltk : tifl.py:change_probs -- tiers.sort(key=accuracy) (stable, sorts the tier list in
           place), prob = np.round((n - (idx - idx_decr)) / D, 5).
    Returns probs indexed by tier id.
    """
    acc = list(tier_accuracies)
    cr = list(credits)
    n = float(len([c for c in cr if c > 0])) if variant == "fltk" else len([c for c in cr if c > 0])
    D = n * (n + 1) / 2
    if variant == "flgo":
        order = np.argsort(acc)
    else:
        order = sorted(range(len(acc)), key=lambda t: acc[t])
    probs = np.zeros(len(acc))
    idx_decr = 0
    for idx, t in enumerate(order):
        if cr[t] > 0:
            val = (n - (idx - idx_decr)) / D
            probs[t] = np.round(float(n - (idx - idx_decr)) / D, 5) if variant == "fltk" else val
        else:
            probs[t] = 0
            idx_decr += 1
    return probs
