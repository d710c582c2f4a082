"""When attention runs on hf-attn's fused Triton kernels, and when on the eager torch path.

On a CUDA device with ``triton`` importable, every variant that has a fused kernel uses it, with no flag. The eager
path (the papers' equations written out in torch) stays for the CPU, for ``output_attentions=True`` (a fused kernel
never materialises the ``[B, H, T, S]`` weights), for a model loaded with ``attn_implementation="eager"``, and for
the analysis tools. Either path can be forced, for debugging:

* the config field ``attention_kernels``: ``"auto"`` (default), ``"triton"`` or ``"eager"``;
* the environment variable ``HF_ATTN_KERNELS`` (same values), which overrides the config.

``"triton"`` on CPU tensors runs the kernels under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is
first imported): slow, but exact, which is how the tests check every kernel without a GPU. Without ``triton``
installed (the CPU install), the kernels are simply unused.
"""

from __future__ import annotations

import os

try:  # optional: the kernels ship with the model code, and run where triton is installed
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised by the test that hides triton
    triton = tl = None

KERNEL_MODES = ("auto", "triton", "eager")
KERNELS_ENV = "HF_ATTN_KERNELS"


def triton_available() -> bool:
    """True when ``triton`` imported."""
    return triton is not None


def interpreting() -> bool:
    """True when Triton's interpreter runs the kernels (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def kernel_mode(config) -> str:
    """``"auto"`` / ``"triton"`` / ``"eager"``: the environment variable, else the config field."""
    return os.environ.get(KERNELS_ENV) or getattr(config, "attention_kernels", "auto") or "auto"


def use_triton(module, tensor, need_weights: bool = False) -> bool:
    """True when ``module``'s attention on ``tensor`` runs on a fused kernel: triton importable, no weights asked
    for, the model not loaded with ``attn_implementation="eager"`` (``module.eager_attention``), and either a CUDA
    tensor (modes auto and triton) or Triton's interpreter on a CPU tensor (mode triton)."""
    if triton is None or need_weights or getattr(module, "eager_attention", False):
        return False
    mode = kernel_mode(module.config)
    if mode == "eager":
        return False
    if tensor.is_cuda:
        return True
    return mode == "triton" and interpreting()
