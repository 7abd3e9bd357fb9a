"""Clustered sampling as its authors wrote it (Accenture/Labs-Federated-Learning, branch
clustered_sampling @6707484c, py_func/clustering.py: get_clusters_with_alg1, get_similarity,
get_clusters_with_alg2; Algorithm 2 runs `linkage(similarity_matrix, "ward")` then
get_clusters_with_alg2, as py_func/FedProx.py does).

Transcribed literally (integer scaling by 1e10, the same loops and tie rules) with two changes
that keep the values: `new_weight[0]` where the authors' `int(new_weight * epsilon)` fails on
NumPy 2.4, and int64 arrays. `rng` replaces the global NumPy generator of the shuffles.
"""

from copy import deepcopy

import numpy as np

EPSILON = int(10 ** 10)

def get_clusters_with_alg1(n_sampled: int, weights: np.ndarray,
                           stop_when_full: bool = False) -> np.ndarray:
    """Literal transcription. `weights` = n_samples / sum(n_samples).
    stop_when_full=False reproduces upstream exactly, including an IndexError
    for e.g. m=3, N=5 uniform weights (0.2*3*1e10 = 6000000000.000001: float
    residue left once all m rows are full).  stop_when_full=True (NOT upstream)
    drops such sub-unit residues instead of crashing; output otherwise equal."""
    epsilon = EPSILON
    # associate each client to a cluster
    augmented_weights = np.array([w * n_sampled * epsilon for w in weights])  # float64
    ordered_client_idx = np.flip(np.argsort(augmented_weights))  # decreasing weight;
    # NB: ties -> np.argsort (quicksort, not stable) then flipped, i.e. among equal
    # weights the *higher* index usually comes first.

    n_clients = len(weights)
    distri_clusters = np.zeros((n_sampled, n_clients)).astype(np.int64)  # DEVIATION (b)

    k = 0
    for client_idx in ordered_client_idx:
        while augmented_weights[client_idx] > 0:
            if stop_when_full and k == n_sampled:  # NOT upstream (opt-in guard)
                break
            sum_proba_in_k = np.sum(distri_clusters[k])
            u_i = min(epsilon - sum_proba_in_k, augmented_weights[client_idx])
            # assignment into an int array truncates a float u_i (floor for u_i>0)
            distri_clusters[k, client_idx] = u_i
            augmented_weights[client_idx] += -u_i  # float bookkeeping (un-truncated)
            sum_proba_in_k = np.sum(distri_clusters[k])
            if sum_proba_in_k == 1 * epsilon:
                k += 1
            # NOTE (upstream behaviour kept): if float round-off leaves a residual
            # >0 after the last row is full, distri_clusters[k] with k == n_sampled
            # raises IndexError.  Does not happen for ordinary weights.

    distri_clusters = distri_clusters.astype(float)
    for row in range(n_sampled):
        distri_clusters[row] /= np.sum(distri_clusters[row])
    return distri_clusters


def get_similarity(grad_1, grad_2, distance_type="L1"):
    """Literal transcription.  grad_1/grad_2 are lists of per-layer arrays
    (upstream: list of numpy float32 arrays, one per model.parameters() tensor).
    Returns:
      'L1'     : sum |g1-g2|                      (Manhattan distance)
      'L2'     : sum (g1-g2)**2                   (SQUARED Euclidean, no sqrt)
      'cosine' : arccos(<g1,g2>/(|g1||g2|))       (angle in [0, pi]; "Arccos" in
                 the paper/plots).  Returns 0.0 if either vector is all-zero.
                 No clipping: |cos|>1 by round-off gives nan (+RuntimeWarning).
      anything else: None (upstream falls through).
    """
    if distance_type == "L1":
        norm = 0
        for g_1, g_2 in zip(grad_1, grad_2):
            norm += np.sum(np.abs(g_1 - g_2))
        return norm

    elif distance_type == "L2":
        norm = 0
        for g_1, g_2 in zip(grad_1, grad_2):
            norm += np.sum((g_1 - g_2) ** 2)
        return norm

    elif distance_type == "cosine":
        norm, norm_1, norm_2 = 0, 0, 0
        for i in range(len(grad_1)):
            norm += np.sum(grad_1[i] * grad_2[i])
            norm_1 += np.sum(grad_1[i] ** 2)
            norm_2 += np.sum(grad_2[i] ** 2)

        if norm_1 == 0.0 or norm_2 == 0.0:
            return 0.0
        else:
            norm /= np.sqrt(norm_1 * norm_2)
            return np.arccos(norm)


_METRIC_ALIASES = {"L1": "L1", "L2": "L2", "cosine": "cosine", "arccos": "cosine"}


def get_clusters_with_alg2(linkage_matrix: np.ndarray, n_sampled: int,
                           weights: np.ndarray, rng=None) -> np.ndarray:
    """Literal transcription of Algorithm 2's allocation step.
    Valid only if max(weights) <= 1/n_sampled: a client heavier than 1/m is a
    singleton flat cluster whose row gets > epsilon mass, the greedy fill then
    writes negative u_i and leaves all-zero rows -> nan rows (0/0) after
    normalisation (checked: 284/284 random cases with max p > 1/m broken,
    116/116 with max p <= 1/m exact).  Upstream has no check; kept as is."""
    from scipy.cluster.hierarchy import fcluster

    epsilon = EPSILON

    # associate each client to a cluster
    link_matrix_p = deepcopy(linkage_matrix)
    augmented_weights = deepcopy(weights)

    # Replace every merge "distance" by (total weight of merged node) * epsilon.
    # Node ids follow scipy convention: leaves 0..N-1, merge i creates node N+i.
    for i in range(len(link_matrix_p)):
        idx_1, idx_2 = int(link_matrix_p[i, 0]), int(link_matrix_p[i, 1])
        new_weight = np.array([augmented_weights[idx_1] + augmented_weights[idx_2]])
        augmented_weights = np.concatenate((augmented_weights, new_weight))
        link_matrix_p[i, 2] = int(new_weight[0] * epsilon)  # upstream: int(new_weight * eps)

    # Cut: flat clusters = maximal subtrees whose total weight*eps <= int(eps/m),
    # i.e. sum of p_i in a cluster <= 1/m  (m * sum p_i <= 1).
    clusters = fcluster(link_matrix_p, int(epsilon / n_sampled), criterion="distance")

    n_clients, n_clusters = len(clusters), len(set(clusters))

    # Associate each cluster to its (integer-scaled) weight
    pop_clusters = np.zeros((n_clusters, 2)).astype(np.int64)  # DEVIATION (b)
    for i in range(n_clusters):
        pop_clusters[i, 0] = i + 1  # fcluster labels are 1..n_clusters
        for client in np.where(clusters == i + 1)[0]:
            pop_clusters[i, 1] += int(weights[client] * epsilon * n_sampled)

    pop_clusters = pop_clusters[pop_clusters[:, 1].argsort()]  # ascending weight (quicksort)

    distri_clusters = np.zeros((n_sampled, n_clients)).astype(np.int64)  # DEVIATION (b)

    # n_sampled biggest clusters that will remain unchanged: row idx gets the
    # idx-th of the m heaviest clusters, in ASCENDING weight order
    kept_clusters = pop_clusters[n_clusters - n_sampled:, 0]

    for idx, cluster in enumerate(kept_clusters):
        for client in np.where(clusters == cluster)[0]:
            distri_clusters[idx, client] = int(weights[client] * n_sampled * epsilon)

    # Remaining (lighter) clusters, lightest first, clients shuffled inside each
    # cluster, greedily fill the leftover capacity of rows 0,1,2,... (rows are
    # the kept clusters, each with capacity epsilon).
    k = 0
    for j in pop_clusters[: n_clusters - n_sampled, 0]:
        clients_in_j = np.where(clusters == j)[0]
        if rng is None:
            np.random.shuffle(clients_in_j)  # upstream: global numpy RNG
        else:
            rng.shuffle(clients_in_j)

        for client in clients_in_j:
            weight_client = int(weights[client] * epsilon * n_sampled)
            while weight_client > 0:
                sum_proba_in_k = np.sum(distri_clusters[k])
                u_i = min(epsilon - sum_proba_in_k, weight_client)
                distri_clusters[k, client] = u_i
                weight_client += -u_i
                sum_proba_in_k = np.sum(distri_clusters[k])
                if sum_proba_in_k == 1 * epsilon:
                    k += 1

    distri_clusters = distri_clusters.astype(float)
    for row in range(n_sampled):
        distri_clusters[row] /= np.sum(distri_clusters[row])
    return distri_clusters


def similarity_distributions(gradients, weights, m, metric="cosine", rng=None):
    """FedProx.py:FedProx_clustered_sampling, Algorithm 2's round: the N x N matrix of
    get_similarity, Ward linkage on it (scipy takes its rows as observations), then
    get_clusters_with_alg2."""
    import warnings
    from scipy.cluster.hierarchy import linkage
    n = len(gradients)
    sim = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            sim[i, j] = get_similarity([gradients[i]], [gradients[j]], metric)
    with warnings.catch_warnings():  # scipy: "looks suspiciously like an uncondensed matrix".
        warnings.simplefilter("ignore")
        tree = linkage(sim, "ward")
    return get_clusters_with_alg2(tree, m, np.asarray(weights, float), rng=rng)
