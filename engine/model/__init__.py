"""The DeepSeek-V2 model on rank 0: the layers (model.py), MLA attention (attention.py, rope.py), the
dense MLP and shared experts (mlp.py), the MoE layer with its gate, route plan and combine (moe.py,
router.py, route_counts.py), and the two step functions, one per phase: decode.py and prefill.py.
Routed experts are reached only through an EP backend (ep/); every kernel choice comes from the
frozen KernelConfig the model is built with (engine/kernels/config.py)."""
from __future__ import annotations
