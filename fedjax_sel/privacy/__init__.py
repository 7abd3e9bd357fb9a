"""User-level differential privacy that is correct under client selection (docs/papers/privacy.md).

Clipping and noise (`clipping.py`, `noise.py`), the private aggregates DP-FedAvg, adaptive
clipping and DP-FTRL (`aggregators.py`, registered as `dp_fedavg`, `dp_adaptive`, `dp_ftrl`),
the accountant over Google's dp-accounting (`accountant.py`) and what a selector may read under
privacy (`selection.py`).
"""

from fedjax_sel.privacy.aggregators import (DPState, dp_adaptive, dp_fedavg, dp_ftrl,
                                            update_noise_multiplier)
from fedjax_sel.privacy.clipping import clip_factors, update_norms

__all__ = ["DPState", "clip_factors", "dp_adaptive", "dp_fedavg", "dp_ftrl",
           "update_noise_multiplier", "update_norms"]
