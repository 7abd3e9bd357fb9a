"""What XLA's analyses of a compiled computation say it costs: planned memory and FLOPs.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> compiled = jax.jit(lambda a: a @ a).lower(jnp.ones((8, 8))).compile()
  >>> flops(compiled)
  1024.0
"""

from __future__ import annotations


def planned_bytes(compiled) -> int:
  """Memory XLA plans for one call: temporaries, arguments and outputs."""
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes


def flops(compiled) -> float:
  """Floating-point operations of one call (0 when the backend gives no count); `compiled` may
  also be a lowered computation (XLA's count before optimization, with no compile)."""
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float((analysis or {}).get("flops", 0.0))
