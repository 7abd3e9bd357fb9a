"""FedLab's bandit sampler (SMILELab-FL/FedLab @92552a74,
fedlab/contrib/client_sampler/importance_sampler.py: MultiArmedBanditSampler; mabs.py and vrb.py
there are empty). `sample` draws with replacement (the global NumPy generator there, `rng`
here) and returns the ids sorted; `update(loss)` takes the feedback in draw order."""

import numpy as np


class MultiArmedBanditSampler:

  def __init__(self, n, T, L, rng):
    self.n = n
    self.w = np.ones(n)
    self.p = np.ones(n) / float(n)
    self.eta = 0.4
    self.delta = np.sqrt((self.eta ** 4) * np.log(self.n) / ((self.n ** 5) * T * (L ** 2)))
    self.rng = rng

  def sample(self, batch_size):
    sampled = self.rng.choice(np.arange(self.n), size=batch_size, replace=True, p=self.p)
    self.last_sampled = (sampled, self.p[sampled])
    return np.sort(sampled)

  def update(self, loss):
    at = np.asarray(loss, float) ** 2 / (self.n ** 2)
    indices, p = self.last_sampled
    self.w[indices] *= np.exp(self.delta * at / p ** 3)
    self.p = (1 - self.eta) * self.w / np.sum(self.w) + self.eta / self.n
