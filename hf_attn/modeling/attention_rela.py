"""ReLA: rectified linear attention (Zhang, Titov & Sennrich 2021, "Sparse Attention with Linear Units").

    alpha = ReLU(q k^T / sqrt(dh))                         Eq. 3   (masked keys get exactly 0: no -inf anywhere)
    o     = LN(alpha V)  over the concatenated heads (d)    Eq. 3
    RMSNorm(z) = z / RMS(z) * g                             Eq. 4   (ReLA-i: g ~ U(-sqrt(3/dh), sqrt(3/dh)))
    LN(z) = sigmoid(w * z) * RMSNorm(z)                     Eq. 5   (ReLA-g: g = 1, w ~ U(-sqrt(3/d), sqrt(3/d)))

Rows may be all zero ("null attention"); the RMS statistic then is 0 and eps keeps the output at exactly 0.
Table 1 ablations are config switches: activation (relu / gelu / leaky_relu), norm (rmsnorm / layernorm / none),
gate on/off, gain init (ones / uniform).

Long inputs: when queries or keys outnumber ``rela_chunk``, alpha V is summed block by block over keys
(`attention_blockwise`): memory grows linearly with the length, values and gradients are those of Eq. 3.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention_base import Hyperparameter, Preset, VariantAttention, all_sites, float32_autocast_off, weighted_values
from .attention_blockwise import ACTIVATIONS, activate, blockwise_relu_attention, use_blocks

NORMS = ("rmsnorm", "layernorm", "none")
GAIN_INITS = ("ones", "uniform")
RELA = "Zhang, Titov & Sennrich 2021, Sparse Attention with Linear Units (EMNLP)"
_RELA_G = all_sites("rela", rela_norm="rmsnorm", rela_gate=True, rela_gain_init="ones")


class RelaAttention(VariantAttention):
    variant = "rela"
    description = "rectified linear attention with a (gated) RMSNorm on its output (Zhang et al. 2021)"
    hyperparameters = (
        Hyperparameter("rela_activation", str, "relu", "activation on the scores: relu (Eq. 3); gelu, leaky_relu are "
                       "Table 1 rows 9-10 (Zhang et al. 2021)", choices=ACTIVATIONS),
        Hyperparameter("rela_norm", str, "rmsnorm", "normalisation of the attention output: rmsnorm (Eq. 4); none = "
                       "row 4 (fails to train), layernorm = row 8 (Zhang et al. 2021, Table 1)", choices=NORMS),
        Hyperparameter("rela_gate", bool, True, "sigmoid gate on the normalised output: ReLA-g (Eq. 5); false with "
                       "rela_gain_init=uniform is ReLA-i (Zhang et al. 2021)"),
        Hyperparameter("rela_gain_init", str, "ones", "norm gain init: ones, or uniform U(-sqrt(3/dh), sqrt(3/dh)) "
                       "for ReLA-i (Zhang et al. 2021, footnote 4)", choices=GAIN_INITS),
        Hyperparameter("rela_eps", float, 1e-8, "epsilon of the RMS statistic; keeps null-attention rows at 0 "
                       "(not in Zhang et al. 2021)", low=0.0, low_open=True),
        Hyperparameter("rela_leaky_relu_slope", float, 0.01, "negative slope with rela_activation=leaky_relu "
                       "(Zhang et al. 2021, Table 1 row 10; PyTorch's default 0.01)", low=0.0, high=1.0),
        Hyperparameter("rela_chunk", int, 256, "queries and keys per block of the block-wise path for long inputs "
                       "(linear memory, same values; not in Zhang et al. 2021); 0 = never", low=0),
    )
    compact_keep = True

    presets = (
        Preset(
            "rela-i",
            "ReLA-i: ReLU attention + RMSNorm with uniform gain init (Table 1, row 6)",
            RELA,
            all_sites("rela", rela_norm="rmsnorm", rela_gate=False, rela_gain_init="uniform"),
        ),
        Preset(
            "rela-g", "ReLA-g: ReLU attention + gated RMSNorm, the paper's main model (Table 1, row 7)", RELA, _RELA_G
        ),
        Preset(
            "relu",
            "ablation: ReLU attention alone, no normalisation (Table 1, row 4; fails to train)",
            RELA,
            all_sites("rela", rela_norm="none", rela_gate=False),
        ),
        Preset(
            "relu-rmsnorm",
            "ablation: ReLU attention + plain RMSNorm, gain 1 (Table 1, row 5)",
            RELA,
            all_sites("rela", rela_norm="rmsnorm", rela_gate=False, rela_gain_init="ones"),
        ),
        Preset(
            "rela-g-layernorm",
            "ablation: ReLA-g with LayerNorm instead of RMSNorm (Table 1, row 8)",
            RELA,
            {**_RELA_G, "rela_norm": "layernorm"},
        ),
        Preset(
            "rela-g-gelu",
            "ablation: ReLA-g with GeLU instead of ReLU (Table 1, row 9)",
            RELA,
            {**_RELA_G, "rela_activation": "gelu"},
        ),
        Preset(
            "rela-g-leaky-relu",
            "ablation: ReLA-g with leaky ReLU instead of ReLU (Table 1, row 10)",
            RELA,
            {**_RELA_G, "rela_activation": "leaky_relu"},
        ),
        Preset(
            "rela-g-encoder-only",
            "ReLA-g in encoder self-attention only, softmax elsewhere (Table 1, row 11)",
            RELA,
            {**_RELA_G, "decoder_attention": "softmax", "cross_attention": "softmax"},
        ),
        Preset(
            "rela-g-decoder-only",
            "ReLA-g in decoder self-attention only, softmax elsewhere (Table 1, row 12)",
            RELA,
            {**_RELA_G, "encoder_attention": "softmax", "cross_attention": "softmax"},
        ),
        Preset(
            "rela-g-cross-only",
            "ReLA-g in cross-attention only, softmax elsewhere (Table 1, row 13)",
            RELA,
            {**_RELA_G, "encoder_attention": "softmax", "decoder_attention": "softmax"},
        ),
    )

    def setup(self, config):
        self.activation = config.rela_activation
        self.norm = config.rela_norm
        self.gated = config.rela_gate
        self.gain_init = config.rela_gain_init
        self.eps = config.rela_eps
        self.leaky_slope = config.rela_leaky_relu_slope
        self.chunk = int(config.rela_chunk)
        d = self.embed_dim
        if self.norm != "none":
            self.rela_gain = nn.Parameter(torch.ones(d))
        if self.norm == "layernorm":
            self.rela_bias = nn.Parameter(torch.zeros(d))
        if self.gated:
            self.rela_gate_weight = nn.Parameter(torch.empty(d))

    def init_variant_weights(self, init):
        if self.norm != "none":
            if self.gain_init == "uniform":
                bound = math.sqrt(3.0 / self.head_dim)
                init.uniform_(self.rela_gain, -bound, bound)
            else:
                init.ones_(self.rela_gain)
        if self.norm == "layernorm":
            init.zeros_(self.rela_bias)
        if self.gated:
            bound = math.sqrt(3.0 / self.embed_dim)
            init.uniform_(self.rela_gate_weight, -bound, bound)

    def attend(self, q, k, v, keep, ctx):
        q = q * self.scaling
        if use_blocks(q.shape[2], k.shape[2], self.chunk, ctx.output_attentions):  # long inputs
            out, _, _ = blockwise_relu_attention(q, k, v, keep, activation=self.activation, slope=self.leaky_slope,
                                                 dropout=self.attn_dropout, chunk=self.chunk)
            return out, None
        weights = activate(torch.matmul(q, k.transpose(-1, -2)), self.activation, self.leaky_slope)
        weights = keep.zero_hidden(weights)  # Eq. 3, multiplicative 0/1 mask
        return weighted_values(weights, v, self.attn_dropout, self.training, need_weights=ctx.output_attentions)

    def post_merge(self, o):
        if self.norm == "none":
            return o
        with float32_autocast_off(o):
            z = o.float()
            params = [self.rela_gain.float(), self.rela_bias.float() if self.norm == "layernorm" else None,
                      self.rela_gate_weight.float() if self.gated else None]
            if torch.is_grad_enabled() and (z.requires_grad or any(p is not None and p.requires_grad for p in params)):
                # recomputed in backward: autograd keeps z alone, not the 3-4 [B,T,d] intermediates
                y = checkpoint(self._norm, z, *params, use_reentrant=False)
            else:
                y = self._norm(z, *params)
        return y.to(o.dtype)

    def _norm(self, z, gain, bias, gate_weight):
        """LN(z) of Eq. 4-5 (float32): RMSNorm (or LayerNorm, Table 1 row 8), then the sigmoid gate if any."""
        if self.norm == "rmsnorm":  # Eq. 4
            y = F.rms_norm(z, (z.shape[-1],), gain, eps=self.eps)
        else:  # LayerNorm (Table 1 row 8)
            y = F.layer_norm(z, (z.shape[-1],), gain, bias, eps=self.eps)
        if gate_weight is not None:  # Eq. 5: the gate reads the un-normalised z
            y = y * torch.sigmoid(gate_weight * z)
        return y
