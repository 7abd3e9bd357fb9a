"""PRNG keys derived from (seed, round, purpose, client id), never from global state.

`round_key(seed, t, purpose)` is `fold_in(fold_in(PRNGKey(seed), t), purpose)`; per-client keys fold
in the client id on top, so a client's randomness does not depend on who else takes part and a run
can resume at any round.

Examples:
  >>> k1 = client_keys(round_key(0, 3, TRAIN), jnp.array([5, 7]))
  >>> k2 = client_keys(round_key(0, 3, TRAIN), jnp.array([7]))
  >>> bool((k1[1] == k2[0]).all())
  True
"""

import jax
import jax.numpy as jnp  # noqa: F401  (the examples above use it)

# Purposes: distinct streams inside one round.
AVAILABILITY = 1
FILTER = 2
SELECT = 3
PARTICIPATE = 4
TRAIN = 5
AGGREGATE = 6
INIT = 7
STATS = 8


def round_key(seed, round_idx, purpose: int) -> jax.Array:
  """Key of one purpose in one round; `seed` and `round_idx` may be traced."""
  key = jax.random.fold_in(jax.random.PRNGKey(seed), round_idx)
  return jax.random.fold_in(key, purpose)


def client_keys(key: jax.Array, client_ids: jax.Array) -> jax.Array:
  """`[K]` keys, one per client id."""
  return jax.vmap(lambda c: jax.random.fold_in(key, c))(client_ids)
