"""Models: flax modules and the architecture-agnostic `Model` bundle."""

from fedjax_sel.models.bundle import (CONV_MODELS, MODELS, ExampleMetrics, Model, build_model,
                                      example_metrics, from_flax, masked_mean_loss,
                                      per_example_loss, train_losses, trainable, with_trainable)
from fedjax_sel.models.conv import CONV_IMPLS, PatchConv, extract_patches, resolve_conv_impl
from fedjax_sel.models.fast_ops import fast_ops
from fedjax_sel.models.pooling import max_pool_2x2

__all__ = [
    "CONV_IMPLS", "CONV_MODELS", "MODELS", "ExampleMetrics", "Model", "build_model",
    "example_metrics", "from_flax", "masked_mean_loss", "per_example_loss", "train_losses",
    "trainable", "with_trainable", "PatchConv", "extract_patches", "resolve_conv_impl",
    "max_pool_2x2", "fast_ops",
]
