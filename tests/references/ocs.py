"""Optimal client sampling's probabilities as its authors compute them
(SamuelHorvath/FL-optimal-client-sampling @baa73e8c, simple_fedavg_tff.py: FedAvg.scale,
create_prob_message, compute_rescaling, rescale_prob, the j_max loop of run_one_round), in
float32 as TensorFlow runs them, and the paper's exact optimum (sorted norms, the largest l with
0 < m + l - n <= sum_{j <= l} u_(j) / u_(l))."""

import numpy as np


def ocs_exact_paper(u, m):
    u = np.asarray(u, dtype=float)
    n = u.size
    if m >= n:
        return np.ones(n)
    order = np.argsort(u, kind="stable")
    us = u[order]
    csum = np.cumsum(us)
    l_best = None
    for count in range(1, n + 1):        # l, a count (1-based)
        c = m + count - n
        if c > 0 and c * us[count - 1] <= csum[count - 1]:
            l_best = count               # keep the LARGEST l that satisfies the condition
    p_sorted = np.ones(n)
    p_sorted[:l_best] = (m + l_best - n) * us[:l_best] / csum[l_best - 1]
    p = np.empty(n)
    p[order] = p_sorted
    return p


def aocs_authors(u, m, j_max=4, importance_sampling=True):
    u = np.asarray(u, dtype=np.float32)
    n = u.size
    # scale(update_norm, sum_update_norms)
    if not importance_sampling:
        return np.full(n, np.float32(m) / np.float32(n))
    prob = np.minimum(np.float32(1.0), (u * np.float32(m)) / np.sum(u))
    # for j in range(j_max): prob, rescaling_factor = run_one_inner_loop_weights_computation(prob)
    for _ in range(j_max):
        # create_prob_message: [prob, 1.] if prob < 1 else [0., 0.] ; federated_sum
        lt1 = prob < 1
        prob_aggreg0 = np.sum(np.where(lt1, prob, 0.0).astype(np.float32))
        prob_aggreg1 = np.float32(np.sum(lt1))
        # compute_rescaling: (m - n + prob_aggreg[1]) / prob_aggreg[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            rescaling_factor = (np.float32(m) - np.float32(n) + prob_aggreg1) / prob_aggreg0
        # rescale_prob: min(1, prob * rescaling_factor)   -- applied to ALL clients
        prob = np.minimum(np.float32(1.0), prob * rescaling_factor)
        if rescaling_factor <= 1:          # python `if` on the returned tensor
            break
    return prob
