"""Where an attention call runs: on torch's SDPA kernel, on one of hf-attn's fused Triton kernels, or on the eager
torch path (the papers' equations written out). One function decides it for every variant, `dispatch`, and the
decisions it records (`record_paths`) are the paths the runs' ``attention_path`` and the GPU suite report.

On a CUDA device every variant that has a fused path takes it, with no flag: a Triton kernel where ``triton`` is
importable (ReLA, ReLUFormer, calibration; sparsemax / entmax through AdaSplash), GMM's product distributed over its
fusion with alpha V by SDPA. The eager path stays for the CPU, for ``output_attentions=True`` and
``output_attention_details=True`` (a fused path never materialises the ``[B, H, T, S]`` weights or a variant's
internal maps), for a model loaded with ``attn_implementation="eager"``, and so for the analysis tools. Softmax's SDPA
is its plain implementation (stock's too): only a request for weights takes it off. Either path can be forced, for
debugging:

* the config field ``attention_kernels``: ``"auto"`` (default), ``"triton"`` or ``"eager"``;
* the environment variable ``HF_ATTN_KERNELS`` (same values), which overrides the config.

``"triton"`` runs the fused paths wherever weights are not asked for and the model was not loaded with
``attn_implementation="eager"``; where a Triton kernel cannot run (no ``triton``; a CPU tensor without Triton's
interpreter) it is one `HfAttnConfigError` line at forward time, never a silent fallback. On CPU tensors it runs them
under Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is first imported): slow, but exact, which is
how the tests check every kernel without a GPU (GMM's SDPA path needs no triton: forced, it runs on the CPU too).
Without ``triton`` installed (the CPU install), ``"auto"`` simply never uses the Triton kernels.

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
SDPA, TRITON, EAGER = "sdpa", "triton", "eager"  # the paths a call can take (`dispatch`)

_trace: PathTrace | None = None  # the decisions while `record_paths` is on


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


def dispatch(module, tensor, fast: str, need_weights: bool = False, supported: bool = True,
             plain: bool = False) -> str:
    """The path this call of ``module``'s attention on ``tensor`` takes: ``fast`` (`TRITON`: a fused Triton kernel;
    `SDPA`: torch's ``scaled_dot_product_attention``) or `EAGER`; recorded while `record_paths` is on.

    ``supported``: whether the fast path takes this call at all (a kernel's own answer for shapes, mask and dtype,
    e.g. `triton_relu.triton_supports`; GMM: no attention dropout); where it says no, the call runs eager in every
    mode. ``plain``: ``fast`` is the variant's plain implementation (softmax's SDPA), which only weights take off.

    Eager when weights are asked for (``need_weights``), when the model set ``module.eager_attention`` (loaded with
    ``attn_implementation="eager"``, or a forward pass asking for weights or details), or in mode "eager". Mode
    "auto": ``tensor`` on CUDA (and, for `TRITON`, triton importable). Mode "triton": always; a Triton kernel on CPU
    tensors under Triton's interpreter, one `HfAttnConfigError` line where it cannot run."""
    if fast not in (SDPA, TRITON):
        raise ValueError(f"dispatch: fast={fast!r} is not one of {(SDPA, TRITON)}")
    path = EAGER
    mode = None if plain else kernel_mode(module.config)
    if plain:
        path = EAGER if need_weights or not supported else fast
    elif not (need_weights or getattr(module, EAGER_FLAG, False)):
        if mode == "auto":
            path = fast if tensor.is_cuda and supported and (fast == SDPA or triton is not None) else EAGER
        elif mode == "triton":
            problem = _cannot_run(KERNELS_ENV if os.environ.get(KERNELS_ENV) else "attention_kernels", tensor)
            if problem is not None and fast == TRITON:
                raise problem
            path = fast if supported else EAGER
    if _trace is not None:
        _trace.record(module, path)
    return path


def set_eager_attention(modules, eager: bool) -> None:
    """Put every module of ``modules`` on the eager path (``eager=True``) or back under `dispatch`'s rules."""
    for module in modules:
        setattr(module, EAGER_FLAG, eager)


class PathTrace(list):
    """The decisions `dispatch` made while `record_paths` was on: ``(variant, site, path)`` per call, in order, and
    ``by_module`` {id(module): the set of paths that module took}."""

    def __init__(self):
        super().__init__()
        self.by_module: dict[int, set[str]] = {}

    def record(self, module, path: str) -> None:
        self.append((getattr(module, "variant", type(module).__name__), getattr(module, "site", None), path))
        self.by_module.setdefault(id(module), set()).add(path)


class record_paths:
    """Within ``with record_paths() as trace:``, every `dispatch` decision is in ``trace`` (a `PathTrace`): which
    path each variant and module took (the GPU benchmark and the runs' ``attention_path`` read it)."""

    def __enter__(self) -> PathTrace:
        global _trace
        self.outer, _trace = _trace, PathTrace()
        return _trace

    def __exit__(self, *exc) -> bool:
        global _trace
        _trace = self.outer
        return False
