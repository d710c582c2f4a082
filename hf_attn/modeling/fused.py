"""When attention runs on hf-attn's fused Triton kernels, and when on the eager torch path.

On a CUDA device with ``triton`` importable, every variant that has a fused kernel uses it, with no flag. The eager
path (the papers' equations written out in torch) stays for the CPU, for ``output_attentions=True`` and
``output_attention_details=True`` (a fused kernel never materialises the ``[B, H, T, S]`` weights or a variant's
internal maps), for a model loaded with ``attn_implementation="eager"``, and so for the analysis tools. Either path
can be forced, for debugging:

* the config field ``attention_kernels``: ``"auto"`` (default), ``"triton"`` or ``"eager"``;
* the environment variable ``HF_ATTN_KERNELS`` (same values), which overrides the config.

``"triton"`` runs the kernels wherever weights are not asked for and the model was not loaded with
``attn_implementation="eager"``; where they cannot run (no ``triton``; a CPU tensor without Triton's interpreter) it
is one `HfAttnConfigError` line at forward time, never a silent fallback. On CPU tensors it runs them under Triton's
interpreter (``TRITON_INTERPRET=1``, set before triton is first imported): slow, but exact, which is how the tests
check every kernel without a GPU. Without ``triton`` installed (the CPU install), ``"auto"`` simply never uses them.

The model sets ``eager_attention`` on its attention modules (`set_eager_attention`): True when
``attn_implementation="eager"`` was requested, and for the duration of a forward pass that asks for weights or
details.
"""

from __future__ import annotations

import os

from .hyperparameters import HfAttnConfigError

try:  # optional: the kernels ship with the model code, and run where triton is installed
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised by the test that hides triton
    triton = tl = None

KERNEL_MODES = ("auto", "triton", "eager")
KERNELS_ENV = "HF_ATTN_KERNELS"
EAGER_FLAG = "eager_attention"  # the attention modules' attribute: True = the eager path, whatever the mode

_trace: list | None = None  # (variant, site, path) of each decision while `record_paths` is on


def triton_available() -> bool:
    """True when ``triton`` imported."""
    return triton is not None


def interpreting() -> bool:
    """True when Triton's interpreter runs the kernels (on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_kernel_mode(value, where: str = "attention_kernels") -> str:
    """``value`` if it is a kernel mode, else one `HfAttnConfigError` line naming it and the valid ones."""
    if value not in KERNEL_MODES:
        raise HfAttnConfigError(
            f"{where}={value!r} is not a kernel mode; valid: {list(KERNEL_MODES)} ('auto': the fused Triton kernels "
            "on CUDA where triton is installed, 'triton': always them, 'eager': never)"
        )
    return value


def kernel_mode(config) -> str:
    """``"auto"`` / ``"triton"`` / ``"eager"``: the environment variable ``HF_ATTN_KERNELS``, else the config field."""
    env = os.environ.get(KERNELS_ENV)
    if env:
        return check_kernel_mode(env, KERNELS_ENV)
    return check_kernel_mode(getattr(config, "attention_kernels", "auto") or "auto")


def _cannot_run(mode_source: str, tensor) -> HfAttnConfigError | None:
    """Why mode "triton" cannot run on ``tensor`` here, or None when it can."""
    if triton is None:
        return HfAttnConfigError(
            f"{mode_source}='triton' needs the triton package, which is not installed: pip install triton (Linux, "
            f"with a CUDA GPU), or use 'auto' (the kernels where they can run) or 'eager'"
        )
    if not tensor.is_cuda and not interpreting():
        return HfAttnConfigError(
            f"{mode_source}='triton': the fused kernels run on CUDA tensors, and this one is on {tensor.device}; move "
            "the model to a GPU, set TRITON_INTERPRET=1 before triton is imported (slow, exact: for tests), or use "
            "'auto' / 'eager'"
        )
    return None


def use_triton(module, tensor, need_weights: bool = False, supported: bool = True) -> bool:
    """True when ``module``'s attention on ``tensor`` runs on a fused kernel.

    ``supported``: the kernel's own answer for this call's shapes and mask (`triton_relu.triton_supports`); where it
    says no, the call runs eager in every mode, and the decision recorded (`record_paths`) says so.

    Never when weights are asked for (``need_weights``), when the model set ``module.eager_attention`` (loaded with
    ``attn_implementation="eager"``, or a forward pass asking for weights or details), or in mode "eager". Mode
    "auto": triton importable and ``tensor`` on CUDA. Mode "triton": always, under Triton's interpreter on CPU
    tensors; one `HfAttnConfigError` line where it cannot run."""
    mode = kernel_mode(module.config)
    decision = False
    if not (need_weights or getattr(module, EAGER_FLAG, False) or mode == "eager"):
        if mode == "auto":
            decision = triton is not None and tensor.is_cuda and supported
        else:
            problem = _cannot_run(KERNELS_ENV if os.environ.get(KERNELS_ENV) else "attention_kernels", tensor)
            if problem is not None:
                raise problem
            decision = supported
    if _trace is not None:
        _trace.append((getattr(module, "variant", type(module).__name__), getattr(module, "site", None),
                       "triton" if decision else "eager"))
    return decision


def set_eager_attention(modules, eager: bool) -> None:
    """Put every module of ``modules`` on the eager path (``eager=True``) or back under `use_triton`'s rules."""
    for module in modules:
        setattr(module, EAGER_FLAG, eager)


class record_paths:
    """Within ``with record_paths() as trace:``, every `use_triton` decision is appended to ``trace`` as
    ``(variant, site, "triton" | "eager")``: which path each variant took (the GPU benchmark records it)."""

    def __enter__(self) -> list:
        global _trace
        self.outer, _trace = _trace, []
        return _trace

    def __exit__(self, *exc) -> bool:
        global _trace
        _trace = self.outer
        return False
