"""FedCS's greedy (Nishio and Yonetani, ICC 2019, Algorithm 2), as jsincn/SelecEval writes it
(seleceval/selection/fedcs.py @a606770b: FedCS.select_clients); there is no authors' code.
`fixed_count` is SelecEval's `fixed_client_no` padding (None: the paper's rule)."""

from collections.abc import Callable, Sequence

import numpy as np


def fedcs_select(candidate_ids: Sequence,
                 update_times: dict,
                 upload_times: dict,
                 deadline: float,
                 dist_time: Callable[[list], float] | None = None,
                 T_cs: float = 0.0,
                 T_agg: float = 0.0,
                 fixed_count: int | None = None,
                 eps: float = 1e-10,
                 return_schedule: bool = False):
    """Greedy FedCS selection (paper Alg. 2 == [S] FedCS.select_clients while-loop).

    candidate_ids : the K' clients that answered the resource request (order = tie-break order;
                    [S] uses Python max(), which returns the FIRST maximal element).
    update_times  : {cid: t^UD_k}   ([S]: client["expected_execution_time"])
    upload_times  : {cid: t^UL_k}   ([S]: model_size / bw * 8)
    deadline      : T_round         ([S]: config "timeout")
    dist_time     : f(list_of_cids) -> T^d_S ; None => 0 (no distribution cost)
    T_cs, T_agg   : paper constants (selection / aggregation time); [S] omits them (=0)
    fixed_count   : [S] only: if fixed_client_no, a client is ALSO accepted whenever
                    len(selected) < int(c * N) even if the deadline is violated.
                    None = paper behaviour.
    Returns selected list in selection (= upload) order, optionally with the schedule.
    """
    Td = (lambda S: 0.0) if dist_time is None else dist_time
    remaining = list(candidate_ids)
    selected: list = []
    theta = 0.0
    schedule = []
    while len(remaining) > 0:
        # x <- argmax_k 1 / (T^d_{S u k} - T^d_S + t^UL_k + max(0, t^UD_k - Theta))
        scores = []
        for k in remaining:
            s = Td(selected + [k]) - Td(selected)
            s += upload_times[k]
            s += max(0, update_times[k] - theta)
            s += eps
            scores.append(1 / s)
        best = remaining[int(np.argmax(scores))]     # first max, like Python max()
        remaining.remove(best)                        # removed whether or not accepted
        theta_d = theta + upload_times[best] + max(0, update_times[best] - theta)
        t = T_cs + Td(selected + [best]) + theta_d + T_agg
        if t < deadline or (fixed_count is not None and len(selected) < fixed_count):
            theta = theta_d
            selected.append(best)
            schedule.append(dict(client=best, upload_end=theta_d, round_time=t))
        # else: rejected, loop continues over the remaining candidates (no break)
    if return_schedule:
        return selected, theta, schedule
    return selected
