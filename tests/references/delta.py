"""DELTA's probability updates as its authors wrote them (L3030/DELTA_FL @bc8e3a7a,
"Femnist and CIfar-10/local_update.py": FedTrain.reweight_prac, and
"Femnist and CIfar-10/local_update_class.py": FedTrain.reweight_prac_theory)."""

import numpy as np


def _norm(v):
    return float(np.sqrt(np.sum(np.asarray(v, dtype=float) ** 2)))


def reweight_prac_C1(P, sample_index, grads, Ls, beta=0.5):
    """grads: list of the S sampled clients' g_i (same order as sample_index)
       Ls   : C1 passes len(DataLoader) = NUMBER OF BATCHES (drop_last=True), not #samples.
       beta : args.beta, default 0.5."""
    P = list(P)
    alpha = 0.0
    G = np.asarray(grads, float)
    c = G.mean(0)                                  # unweighted mean over sampled clients
    sum_L = float(sum(Ls))
    weights1 = [L / sum_L * _norm(g) for L, g in zip(Ls, G)]
    weights2 = [L / sum_L * _norm(g - c) for L, g in zip(Ls, G)]
    weights = [(1 - beta) * a + beta * b for a, b in zip(weights1, weights2)]
    sum_weights = sum(weights)
    sum_old_weights = sum([P[i] for i in sample_index])
    weights = [w / sum_weights * sum_old_weights for w in weights]
    for i in range(len(weights)):
        P[sample_index[i]] = alpha * P[sample_index[i]] + (1 - alpha) * weights[i]
    return np.array(P)


def reweight_prac_theory_C2(grads_all, Ls_all, beta=0.5):
    """Ls_all = len(data_set) (#samples).  Returns P over the N clients of sample_index_temp."""
    G = np.asarray(grads_all, float)
    sum_L = float(sum(Ls_all))
    c = G.mean(0)
    w = [beta * (L / sum_L) * _norm(g - c) + (1 - beta) * (L / sum_L) for L, g in zip(Ls_all, G)]
    s = sum(w)
    return np.array([x / s for x in w])
