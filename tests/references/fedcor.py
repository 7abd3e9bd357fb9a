"""FedCor as its authors wrote it (Yoruko-Tang/FedCor @d941083c, src/GPR.py: Poly_Kernel,
Kernel_GPR.Covariance, GPR.Select_Clients, GPR.MLE_Mean, GPR.Train with the default MML loss), in
NumPy: the linear kernel with the fixed 0.01 noise, the greedy selection (HEAD: sums over the
remaining clients), the discounted mean, and the Adam fit with the torch update rule."""

import math
from collections.abc import Sequence

import numpy as np


def poly_kernel(xs: np.ndarray, order: int = 1, normalize: bool = False,
                sigma_f: float = 1.0) -> np.ndarray:
    """GPR.py:Poly_Kernel.forward.   xs: [D, n] (columns = client embeddings).
        k = xs^T xs
        if Normalize: k = k / sqrt(A) / sqrt(A^T), A_ij = ||x_j||^2 ; return k**order * sigma_f**2
        else:         return k**order            # NOTE: sigma_f NOT used (default path)
    Default path (poly_norm=0, order=1): K = X^T X  (linear kernel, no scale)."""
    k = xs.T @ xs
    if normalize:
        n = xs.shape[1]
        A = np.sum(xs ** 2, axis=0, keepdims=True) * np.ones((n, n), dtype=xs.dtype)
        k = k / np.sqrt(A) / np.sqrt(A.T)
        return np.power(k, order) * sigma_f ** 2
    return np.power(k, order)


def covariance(pmatrix: np.ndarray, ids: Sequence[int] | None = None,
               noise: float = 0.01, order: int = 1, normalize: bool = False,
               sigma_f: float = 1.0) -> np.ndarray:
    """GPR.py:Kernel_GPR.Covariance
        if ids is None: ids = list(range(num_users))
        xs = self.Projection(ids)                 # PMatrix[:, ids]
        return self.Kernel(xs) + (self.noise**2) * eye(len(ids))
    noise is a FIXED (non-trainable) tensor 0.01 in HEAD -> jitter 1e-4 on the
    diagonal.  The returned matrix is what Select_Clients / Posteriori use."""
    if ids is None:
        ids = list(range(pmatrix.shape[1]))
    xs = pmatrix[:, np.asarray(ids, dtype=np.int64)]
    K = poly_kernel(xs, order=order, normalize=normalize, sigma_f=sigma_f)  # The default kernel.
    return K + (noise ** 2) * np.eye(len(ids), dtype=pmatrix.dtype)


def select_clients(cov: np.ndarray, mu: np.ndarray | None, noise: float, K: int,
                   weights: np.ndarray | None, discount: np.ndarray | None = None,
                   epsilon_greedy: float = 0.0, dynamic_C: bool = False,
                   dynamic_TH: float = 0.0, u: float | None = None,
                   cov_includes_noise: bool = True, return_scores: bool = False):
    """Literal transcription of GPR.py:GPR.Select_Clients (HEAD d941083).

    Arguments
      cov      [N,N]  prior covariance = Kernel_GPR.Covariance() (already contains
                      noise**2 * I).  If cov_includes_noise=False, noise**2*I is added
                      here so that a raw kernel matrix can be passed.
      mu       [N]    UNUSED by the authors' selection (kept only for API symmetry;
                      the greedy depends on Sigma, weights and discount only).
      noise    float  only used when cov_includes_noise=False.
      K        int    number of clients = max(int(frac*num_users),1)  (federated_main.py)
      weights  [N]    p_i = len(user_groups[i]) / len(train_dataset)   (utils.py:get_dataset);
                      federated_main.py always passes it (never None).
      discount [N]    GPR.discount (beta^{#times selected since last Reset_Discount});
                      None -> ones (state right after Reset_Discount).
      epsilon_greedy, u : code does `prob = np.random.rand(1)[0]; if prob<epsilon: return None`.
                      Here the uniform draw is an explicit argument u (None -> no draw,
                      treated as "not epsilon"), so the function is deterministic.
                      NOTE: the draw happens in the authors' code even when epsilon=0
                      (it consumes one np.random number per call).
      dynamic_C, dynamic_TH : `if Dynamic and -total_loss_decrease < Dynamic_TH: break`
                      (literal; see fedcor.md: the sign is inconsistent in HEAD).

    Per greedy step (max_loss_decrease_client):
      Sigma_valid = Sigma[R][:,R]                       R = remaining clients
      Diag_valid  = discount[R] / sqrt(diag(Sigma_valid))          # alpha_k / sigma_k
      score_k     = sum_{i in R} w_i * Sigma[i,k] * Diag_valid[k]  # rows restricted to R!
      k*          = R[argmax score]
      Sigma      <- Sigma - Sigma[:,k*] Sigma[k*,:] / Sigma[k*,k*]  (full NxN rank-1 update)
    Returns list of selected ids (python ints, selection order), or None (epsilon branch).
    With return_scores=True also returns the list of per-step max scores (mld)."""
    Sigma = np.array(cov, copy=True)
    N = Sigma.shape[0]
    if not cov_includes_noise:
        Sigma = Sigma + (noise ** 2) * np.eye(N, dtype=Sigma.dtype)
    disc = (np.ones(N, dtype=Sigma.dtype) if discount is None
            else np.asarray(discount, dtype=Sigma.dtype))
    w = None if weights is None else np.asarray(weights)

    # prob = np.random.rand(1)[0]; if prob<epsilon: return None
    if u is not None and u < epsilon_greedy:
        return (None, []) if return_scores else None

    def max_loss_decrease_client(client_group, Sigma, weights):
        Sigma_valid = Sigma[:, client_group][client_group, :]
        Diag_valid = disc[client_group] / np.sqrt(np.diagonal(Sigma_valid))  # alpha_k/sigma_k
        if weights is None:
            total_loss_decrease = np.sum(Sigma_valid, axis=0) * Diag_valid
        else:
            # sum_i Sigma_ik*p_i   (torch.tensor(weights[client_group], dtype=torch.float))
            wv = weights[client_group].astype(Sigma.dtype).reshape([len(client_group), 1])
            total_loss_decrease = np.sum(wv * Sigma_valid, axis=0) * Diag_valid
        idx = int(np.argmax(total_loss_decrease))          # torch.max(...,0)
        mld = float(total_loss_decrease[idx])
        selected_idx = client_group[idx]
        col = Sigma[:, selected_idx:selected_idx + 1]
        p_Sigma = Sigma - col @ Sigma[selected_idx:selected_idx + 1, :] \
            / Sigma[selected_idx, selected_idx]
        return selected_idx, p_Sigma, mld

    remain_clients = list(range(N))
    selected_clients: list[int] = []
    scores: list[float] = []
    for _ in range(K):
        idx, Sigma, total_loss_decrease = max_loss_decrease_client(remain_clients, Sigma, w)
        if dynamic_C and -total_loss_decrease < dynamic_TH:
            break
        selected_clients.append(int(idx))
        scores.append(total_loss_decrease)
        remain_clients.remove(idx)
    return (selected_clients, scores) if return_scores else selected_clients


def mvn_logpdf(x: np.ndarray, loc: np.ndarray, S: np.ndarray) -> float:
    """torch MultivariateNormal(loc, covariance_matrix=S).log_prob(x)."""
    n = len(x)
    L = np.linalg.cholesky(S)
    r = np.linalg.solve(L, x - loc)
    return float(-0.5 * (n * math.log(2 * math.pi)) - np.sum(np.log(np.diag(L))) - 0.5 * r @ r)


def mle_mean(data: dict[int, np.ndarray], num_users: int, gamma: float) -> np.ndarray:
    """GPR.py:GPR.MLE_Mean: gamma-discounted average of historical loss changes.
        mu_i = sum_e gamma^(T-e) dL_e,i / sum_e gamma^(T-e),  T = max(data.keys())
    (the `if g==0: g+=1e-6` guard is moot: all N clients appear in every sample)."""
    mu = np.zeros(num_users)
    T = max(data.keys())
    cum = np.zeros(num_users)
    for e in data.keys():
        for d in data[e]:
            idx = d[:, 0].astype(np.int64)
            val = d[:, 1]
            mu[idx] += (gamma ** (T - e)) * val
            cum[idx] += gamma ** (T - e)
    cum = np.where(cum == 0.0, cum + 1e-6, cum)
    return mu / cum


def gp_train_loss_and_grad(pmatrix: np.ndarray, mu: np.ndarray, data: dict[int, np.ndarray],
                           gamma: float, noise: float = 0.01) -> tuple[float, np.ndarray]:
    """Loss of GPR.py:GPR.Train for loss_type='MML' with the DEFAULT kernel
    (Poly, order 1, Normalize False => Cov(idx) = X_idx^T X_idx + noise^2 I):
        loss = - sum_e gamma^(T-e) * Log_Marginal_Likelihood(data[e]),  T = max(keys)
    and its analytic gradient w.r.t. PMatrix (torch autograd equivalent):
        dLoss/dCov = w_e * 0.5 * (Cov^-1 - a a^T),  a = Cov^-1 (val - mu[idx])
        dLoss/dX[:,idx] += 2 X[:,idx] dLoss/dCov
    mu is a constant (detached) here, as in the code."""
    T = max(data.keys())
    loss = 0.0
    grad = np.zeros_like(pmatrix)
    for e in data.keys():
        we = gamma ** (T - e)
        for d in data[e]:
            idx = d[:, 0].astype(np.int64)
            val = d[:, 1]
            C = covariance(pmatrix, idx, noise=noise)
            loss -= we * mvn_logpdf(val, mu[idx], C)
            Cinv = np.linalg.inv(C)
            a = Cinv @ (val - mu[idx])
            G = we * 0.5 * (Cinv - np.outer(a, a))
            np.add.at(grad.T, idx, (2.0 * pmatrix[:, idx] @ G).T)
    return loss, grad


def gp_train(pmatrix: np.ndarray, data: dict[int, np.ndarray], num_users: int, gamma: float,
             lr: float = 1e-2, max_epoches: int = 100, update_mean: bool = False,
             mu: np.ndarray | None = None, noise: float = 0.01,
             betas=(0.9, 0.999), eps: float = 1e-8):
    """GPR.py:GPR.Train for the default path (MML, Poly order 1, no normalization).
      - a NEW torch.optim.Adam is built on every call (state reset), weight_decay=0;
        group 1: PMatrix lr=lr (=1e-2 in main); group 2: sigma_f lr=llr (=0.01)
        -- sigma_f gets no gradient with the unnormalized Poly kernel, so Adam skips it.
      - if update_mean: mu = MLE_Mean() once at the start of Train; else mu unchanged
        (zeros forever if update_mean is never set).
      - max_epoches full-batch iterations of loss.backward(); optimizer.step().
      - returns (pmatrix, mu, last_loss) where last_loss is the loss computed in the
        final iteration (before its step), as `return loss.item()`.
    Adam update (torch): m=b1 m+(1-b1)g; v=b2 v+(1-b2)g^2;
        p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)."""
    X = np.array(pmatrix, copy=True)
    mu = np.zeros(num_users) if mu is None else np.array(mu, copy=True)
    if update_mean:
        mu = mle_mean(data, num_users, gamma)
    m = np.zeros_like(X)
    v = np.zeros_like(X)
    loss = None
    for t in range(1, max_epoches + 1):
        loss, g = gp_train_loss_and_grad(X, mu, data, gamma, noise)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        step = lr / (1 - betas[0] ** t)
        denom = np.sqrt(v) / math.sqrt(1 - betas[1] ** t) + eps
        X = X - step * m / denom
    return X, mu, loss
