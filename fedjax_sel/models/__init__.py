"""Models: flax modules and the architecture-agnostic `Model` bundle."""

from fedjax_sel.models.bundle import (MODELS, ExampleMetrics, Model, build_model, example_metrics,
                                      from_flax, masked_mean_loss, per_example_loss, train_losses,
                                      trainable, with_trainable)
from fedjax_sel.models.conv import PatchConv, extract_patches

__all__ = [
    "MODELS", "ExampleMetrics", "Model", "build_model", "example_metrics", "from_flax",
    "masked_mean_loss", "per_example_loss", "train_losses", "trainable", "with_trainable",
    "PatchConv", "extract_patches",
]
