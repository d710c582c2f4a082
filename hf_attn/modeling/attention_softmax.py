"""Softmax attention and the sparse baselines of the ReLA paper: sparsemax and 1.5-entmax.

Softmax: Vaswani et al. 2017, Eq. 1. sparsemax (Martins & Astudillo 2016) and 1.5-entmax (Peters et al. 2019)
replace softmax, as in Zhang, Titov & Sennrich 2021 (ReLA paper, Table 1 rows 2-3), using the `entmax` package.

On CUDA tensors with the `adasplash` package installed (``pip install hf-attn[gpu]``), the normaliser is AdaSplash's
Triton entmax instead (Gonçalves et al. 2025, "AdaSplash: Adaptive Sparse Flash Attention"; BSD-3-Clause): one
kernel per row block for the forward and one for the backward, in place of the package's sort, cumulative sums and
their autograd nodes. It finds the same threshold tau (alpha = 2: sparsemax, 1.5: 1.5-entmax) by a histogram
initialisation and `ADASPLASH_ITERATIONS` hybrid Halley/Newton/secant steps, exact to float32 rounding (the test
compares values and gradients with the `entmax` package). `fused.dispatch` decides, as for every fused kernel:
not for ``output_attentions`` or ``attn_implementation="eager"``, nor under ``HF_ATTN_KERNELS=eager``, which is how
to time or check the `entmax` package's path on a GPU.
"""

from __future__ import annotations

import torch

from .attention_base import VariantAttention
from .citations import CITATIONS
from .hyperparameters import Preset, all_sites
from .fused import EAGER, SDPA, TRITON, dispatch
from .kernels import float32_autocast_off, softmax_attention, weighted_values

try:  # optional extra: pip install entmax
    from entmax import entmax15, sparsemax
except ImportError:  # pragma: no cover - exercised by a test that hides the package
    entmax15 = sparsemax = None
try:  # optional extra [gpu]: AdaSplash's Triton entmax, used on CUDA tensors
    from adasplash import triton_entmax as adasplash_entmax
except ImportError:  # pragma: no cover - the CPU install
    adasplash_entmax = None

TRANSFORMER_PAPER = CITATIONS["transformer"]
RELA_PAPER = CITATIONS["rela"]
SPARSEMAX_PAPER = CITATIONS["sparsemax"]
ENTMAX_PAPER = CITATIONS["entmax"]

# A finite fill for masked scores: entmax's sort/threshold never selects them, and no -inf can turn into NaN.
MASKED_SCORE = -1e9
# AdaSplash's threshold iterations after its histogram initialisation (its default): float32-exact on attention rows
ADASPLASH_ITERATIONS = 2


class SoftmaxAttention(VariantAttention):
    """softmax(q k^T / sqrt(dh)) V (SDPA when the weights are not requested)."""

    variant = "softmax"
    description = "standard scaled dot-product softmax attention (Vaswani et al. 2017)"
    presets = (
        Preset(
            "softmax",
            "vanilla softmax attention everywhere (the baseline)",
            TRANSFORMER_PAPER,
            all_sites("softmax"),
        ),
    )

    def attend(self, q, k, v, keep, ctx):
        # SDPA is softmax's plain implementation (stock's too): only a request for weights takes it off
        eager = dispatch(self, q, SDPA, ctx.output_attentions, plain=True) == EAGER
        return softmax_attention(q, k, v, keep, self.scaling, self.attn_dropout, eager)


def require_entmax(variant: str):
    if sparsemax is None:
        raise ImportError(
            f"attention variant '{variant}' needs the `entmax` package, which is not installed: "
            "run `pip install entmax` (or `pip install hf-attn[sparse]`)."
        )


def sparsemax_forward(z: torch.Tensor) -> torch.Tensor:
    """sparsemax over the last axis by sorting, without autograd (Martins & Astudillo 2016, Prop. 1):
    k(z) = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)},  tau(z) = (sum_{j<=k(z)} z_(j) - 1) / k(z),  p = [z - tau(z)]_+.

    `entmax.sparsemax` computes the same, through an autograd `Function` and a few more ops; in a decoding step
    (one query per row, no gradient) those costs are most of the call, so `attend` uses this when nothing needs a
    gradient. tests/modeling/test_softmax.py checks it against the package."""
    z_sorted = z.sort(dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cumsum = z_sorted.cumsum(-1) - 1
    support = (k * z_sorted > cumsum).sum(-1, keepdim=True)
    return (z - cumsum.gather(-1, support - 1) / support).clamp_min(0)


def entmax15_forward(z: torch.Tensor) -> torch.Tensor:
    """1.5-entmax over the last axis by sorting, without autograd (Peters et al. 2019, Algorithm 2): with
    z <- (z - max z) / 2 sorted decreasingly, for each k: mean_k, ss_k = k (mean of squares_k - mean_k^2),
    tau_k = mean_k - sqrt([(1 - ss_k) / k]_+); k* = #{k : tau_k <= z_(k)}; p = [z - tau_k*]_+^2.
    The same steps as `entmax.entmax15`, forward only (see `sparsemax_forward`)."""
    z = (z - z.amax(-1, keepdim=True)) / 2
    z_sorted = z.sort(dim=-1, descending=True).values
    inv_k = 1 / torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    mean = z_sorted.cumsum(-1) * inv_k
    mean_sq = z_sorted.square().cumsum(-1) * inv_k
    tau = mean - (inv_k - (mean_sq - mean.square())).clamp_min_(0).sqrt_()  # (1 - ss_k) / k = 1/k - ss_k / k
    support = (tau <= z_sorted).sum(-1, keepdim=True)
    return (z - tau.gather(-1, support - 1)).clamp_min(0).square()


def adasplash_normalise(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """alpha-entmax over the last axis of float32 ``scores`` with AdaSplash's Triton kernels (alpha = 2: sparsemax,
    1.5: 1.5-entmax), differentiable; exactly 0 on the masked (``MASKED_SCORE``) keys, like the `entmax` package."""
    return adasplash_entmax(scores.contiguous(), alpha=alpha, n_iter=ADASPLASH_ITERATIONS, use_histogram=True)


def as_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 and contiguous, in one copy (none when it is both already)."""
    return x.to(torch.float32, memory_format=torch.contiguous_format)


class _EntmaxFamilyAttention(VariantAttention):
    """p = normaliser(q k^T / sqrt(dh)) over the visible keys, computed in float32; out = dropout(p) V."""

    @staticmethod
    def normaliser(scores: torch.Tensor) -> torch.Tensor:
        """The differentiable normaliser (the `entmax` package)."""
        raise NotImplementedError

    @staticmethod
    def forward_only(scores: torch.Tensor) -> torch.Tensor:
        """The same values without autograd (decoding, evaluation)."""
        raise NotImplementedError

    alpha: float = 0.0  # the entmax alpha (AdaSplash's kernels take it as a number)

    def setup(self, config):
        require_entmax(self.variant)

    def normalise(self, scores: torch.Tensor, need_weights: bool) -> torch.Tensor:
        """The normaliser for ``scores``: AdaSplash's Triton kernels on a CUDA tensor when installed and
        `fused.dispatch` allows it, else the `entmax` package (with a gradient) or `forward_only` (without)."""
        supported = adasplash_entmax is not None and scores.is_cuda
        if dispatch(self, scores, TRITON, need_weights, supported) == TRITON:
            return adasplash_normalise(scores, self.alpha)
        return self.normaliser(scores) if scores.requires_grad else self.forward_only(scores)

    def attend(self, q, k, v, keep, ctx):
        with float32_autocast_off(q):
            # float32 q and k, each one copy already laid out for the matmul (which would copy the [B, T, H, dh]
            # views of the projections once more); a row with no visible key sees all: entmax would index -1 on it
            scores = keep.scale_and_fill(torch.matmul(as_float32(q), as_float32(k).transpose(-1, -2)), self.scaling,
                                         MASKED_SCORE)
            weights = self.normalise(scores, ctx.output_attentions)  # exactly 0 on the masked keys: no "* keep"
        return weighted_values(weights, v, self.attn_dropout, self.training, need_weights=True)


class SparsemaxAttention(_EntmaxFamilyAttention):
    """sparsemax(z) = argmin_p ||p - z||^2 over the simplex (Martins & Astudillo 2016, Eq. 2)."""

    variant = "sparsemax"
    alpha = 2.0
    description = "sparsemax instead of softmax (Martins & Astudillo 2016; baseline of the ReLA paper)"
    presets = (
        Preset(
            "sparsemax",
            "sparsemax at all attention sites (ReLA paper Table 1, row 2)",
            f"{SPARSEMAX_PAPER}; as compared in {RELA_PAPER}",
            all_sites("sparsemax"),
        ),
    )

    @staticmethod
    def normaliser(scores):
        return sparsemax(scores, dim=-1)

    forward_only = staticmethod(sparsemax_forward)


class Entmax15Attention(_EntmaxFamilyAttention):
    """1.5-entmax(z) = argmax_p p^T z + H^T_1.5(p) (Peters et al. 2019, Eq. 9 with alpha = 1.5)."""

    variant = "entmax15"
    alpha = 1.5
    description = "1.5-entmax instead of softmax (Peters et al. 2019; baseline of the ReLA paper)"
    presets = (
        Preset(
            "entmax15",
            "1.5-entmax at all attention sites (ReLA paper Table 1, row 3)",
            f"{ENTMAX_PAPER}; as compared in {RELA_PAPER}",
            all_sites("entmax15"),
        ),
    )

    @staticmethod
    def normaliser(scores):
        return entmax15(scores, dim=-1)

    forward_only = staticmethod(entmax15_forward)
