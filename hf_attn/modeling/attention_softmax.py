"""Softmax attention and the sparse baselines of the ReLA paper: sparsemax and 1.5-entmax.

Softmax: Vaswani et al. 2017, Eq. 1. sparsemax (Martins & Astudillo 2016) and 1.5-entmax (Peters et al. 2019)
replace softmax, as in Zhang, Titov & Sennrich 2021 (ReLA paper, Table 1 rows 2-3), using the `entmax` package.
"""

from __future__ import annotations

import torch

from .attention_base import (
    Preset,
    VariantAttention,
    all_sites,
    float32_autocast_off,
    nonempty,
    softmax_attention,
    weighted_values,
)

try:  # optional extra: pip install entmax
    from entmax import entmax15, sparsemax
except ImportError:  # pragma: no cover - exercised by a test that hides the package
    entmax15 = sparsemax = None

RELA_PAPER = "Zhang, Titov & Sennrich 2021, Sparse Attention with Linear Units (EMNLP)"

# A finite fill for masked scores: entmax's sort/threshold never selects them, and no -inf can turn into NaN.
MASKED_SCORE = -1e9


class SoftmaxAttention(VariantAttention):
    """softmax(q k^T / sqrt(dh)) V (SDPA when the weights are not requested)."""

    variant = "softmax"
    description = "standard scaled dot-product softmax attention (Vaswani et al. 2017)"
    presets = (
        Preset(
            "softmax",
            "vanilla softmax attention everywhere (the baseline)",
            "Vaswani et al. 2017, Attention Is All You Need",
            all_sites("softmax"),
        ),
    )

    compact_keep = True

    def attend(self, q, k, v, keep, ctx):
        return softmax_attention(q, k, v, keep, self.scaling, self.attn_dropout, ctx.output_attentions)


def require_entmax(variant: str):
    if sparsemax is None:
        raise ImportError(
            f"attention variant '{variant}' needs the `entmax` package, which is not installed: "
            "run `pip install entmax` (or `pip install hf-attn[sparse]`)."
        )


class _EntmaxFamilyAttention(VariantAttention):
    """p = normaliser(q k^T / sqrt(dh)) over the visible keys, computed in float32; out = dropout(p) V."""

    @staticmethod
    def normaliser(scores: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def setup(self, config):
        require_entmax(self.variant)

    def attend(self, q, k, v, keep, ctx):
        keep = nonempty(keep)  # an all-masked row makes entmax index -1: never feed one
        with float32_autocast_off(q):
            scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.scaling
            scores = scores.masked_fill(~keep, MASKED_SCORE)
            weights = self.normaliser(scores)  # exactly 0 on the masked keys: no "* keep" needed
        return weighted_values(weights, v, self.attn_dropout, self.training, need_weights=True)


class SparsemaxAttention(_EntmaxFamilyAttention):
    """sparsemax(z) = argmin_p ||p - z||^2 over the simplex (Martins & Astudillo 2016, Eq. 2)."""

    variant = "sparsemax"
    description = "sparsemax instead of softmax (Martins & Astudillo 2016; baseline of the ReLA paper)"
    presets = (
        Preset(
            "sparsemax",
            "sparsemax at all attention sites (ReLA paper Table 1, row 2)",
            RELA_PAPER,
            all_sites("sparsemax"),
        ),
    )

    @staticmethod
    def normaliser(scores):
        return sparsemax(scores, dim=-1)


class Entmax15Attention(_EntmaxFamilyAttention):
    """1.5-entmax(z) = argmax_p p^T z + H^T_1.5(p) (Peters et al. 2019, Eq. 9 with alpha = 1.5)."""

    variant = "entmax15"
    description = "1.5-entmax instead of softmax (Peters et al. 2019; baseline of the ReLA paper)"
    presets = (
        Preset(
            "entmax15",
            "1.5-entmax at all attention sites (ReLA paper Table 1, row 3)",
            RELA_PAPER,
            all_sites("entmax15"),
        ),
    )

    @staticmethod
    def normaliser(scores):
        return entmax15(scores, dim=-1)
