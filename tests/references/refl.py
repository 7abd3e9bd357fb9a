"""REFL's intelligent participant selection as its authors wrote it (ahmedcs/REFL @aa7e6425,
core/client_manager.py: getPriority's sets and resampleClients), summarised without its random
draws: which clients are always picked, and how many are drawn from which pool."""

from collections.abc import Sequence


def refl_ips_sets(online: Sequence[int], priority) -> tuple[list, list]:
  """resampleClients, avail_priority >= 1, before the accuracy sub-sampling:
  priority_clients = online clients with priority 1, remaining_clients = priority 0, both in the
  online order (feasibleClients order = registration order)."""
  pr = {c: int(priority[c]) for c in online}
  return [c for c, v in pr.items() if v == 1], [c for c, v in pr.items() if v == 0]


def refl_ips_plan(online, priority, num_clients, avail_priority=1):
  """Deterministic summary with avail_probability = 0 and sample_mode random (for tests):
  returns (must, pool, draw) -- `must` clients always picked, `draw` clients drawn uniformly
  from `pool` (random selector: shuffle, then take min(target, len(pool) - 1)).

  avail_priority 1: P = priority clients.  If |P| >= K: must = [], pool = P,
    draw = min(K, |P| - 1).  If |P| < K: the pool is P plus K - |P| uniformly drawn remaining
    clients (|pool| = K), and draw = K - 1: one of the K is dropped at random (the
    `len(selection_list) - 1` of the random path), so a priority client can be dropped too.
  avail_priority 2: if |P| <= K: must = P, pool = remaining, draw = min(K - |P|, |R| - 1);
    else must = [], pool = P, draw = min(K, |P| - 1).
  If |online| <= K every online client is picked (must = online).
  """
  online = list(online)
  if len(online) <= num_clients:
    return online, [], 0
  p, r = refl_ips_sets(online, priority)
  if avail_priority == 1:
    if len(p) >= num_clients:
      return [], p, min(num_clients, len(p) - 1)
    return [], p + ["<random remaining>"] * (num_clients - len(p)), num_clients - 1
  if avail_priority == 2:
    if len(p) <= num_clients:
      return p, r, min(num_clients - len(p), len(r) - 1)
    return [], p, min(num_clients, len(p) - 1)
  return [], online, min(num_clients, len(online) - 1)
