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
On a GPU (`fused.dispatch`), Eq. 3 runs at any length in one fused Triton kernel (`triton_relu`) instead.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from .attention_base import VariantAttention
from .attention_blockwise import ACTIVATIONS, activate, blockwise_relu_attention, use_blocks
from .citations import CITATIONS
from .fused import TRITON, dispatch
from .hyperparameters import Hyperparameter, Preset, all_sites
from .kernels import float32_autocast_off, weighted_values
from .triton_relu import triton_relu_attention, triton_supports

NORMS = ("rmsnorm", "layernorm", "none")
GAIN_INITS = ("ones", "uniform")
RELA = CITATIONS["rela"]
_RELA_G = all_sites("rela", rela_norm="rmsnorm", rela_gate=True, rela_gain_init="ones")


class RelaAttention(VariantAttention):
    variant = "rela"
    description = "rectified linear attention with a (gated) RMSNorm on its output (Zhang et al. 2021)"
    hyperparameters = (
        Hyperparameter("rela_activation", str, "relu", "activation on the scores: relu (Eq. 3); gelu, leaky_relu are "
                       "Table 1 rows 9-10 (Zhang et al. 2021)", choices=ACTIVATIONS,
                       symbol="ReLU in alpha = ReLU(q k^T / sqrt(d)) (Eq. 3)"),
        Hyperparameter("rela_norm", str, "rmsnorm", "normalisation of the attention output: rmsnorm (Eq. 4); none = "
                       "row 4 (fails to train), layernorm = row 8 (Zhang et al. 2021, Table 1)", choices=NORMS,
                       symbol="LN(.) on the attention output (Eq. 3; RMSNorm, Eq. 4)"),
        Hyperparameter("rela_gate", bool, True, "sigmoid gate on the normalised output: ReLA-g (Eq. 5); false with "
                       "rela_gain_init=uniform is ReLA-i (Zhang et al. 2021)",
                       symbol="sigma(w * z), the gate of ReLA-g (Eq. 5)"),
        Hyperparameter("rela_gain_init", str, "ones", "norm gain init: ones, or uniform U(-sqrt(3/dh), sqrt(3/dh)) "
                       "for ReLA-i (Zhang et al. 2021, footnote 4)", choices=GAIN_INITS,
                       symbol="g ~ U(-sqrt(3/d_h), sqrt(3/d_h)), ReLA-i (footnote 4)"),
        Hyperparameter("rela_eps", float, 1e-8, "epsilon of the RMS statistic; keeps null-attention rows at 0 "
                       "(not in Zhang et al. 2021)", low=0.0, low_open=True,
                       symbol="epsilon in RMS(z) (Eq. 4; no value in the paper)"),
        Hyperparameter("rela_leaky_relu_slope", float, 0.01, "negative slope with rela_activation=leaky_relu "
                       "(Zhang et al. 2021, Table 1 row 10; PyTorch's default 0.01)", low=0.0, high=1.0),
        Hyperparameter("rela_chunk", int, 256, "queries and keys per block of the block-wise path for long inputs "
                       "(linear memory, same values; not in Zhang et al. 2021); 0 = never", low=0),
    )

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
        if dispatch(self, q, TRITON, ctx.output_attentions, triton_supports(q, k, keep)) == TRITON:  # any length
            out, _, _ = triton_relu_attention(q, k, v, keep, activation=self.activation, slope=self.leaky_slope,
                                              dropout=self.attn_dropout, scale=self.scaling)
            return out, None
        if use_blocks(q.shape[2], k.shape[2], self.chunk, ctx.output_attentions):  # long inputs
            out, _, _ = blockwise_relu_attention(q, k, v, keep, activation=self.activation, slope=self.leaky_slope,
                                                 dropout=self.attn_dropout, chunk=self.chunk, scale=self.scaling)
            return out, None
        # Eq. 3: relu(q k^T / sqrt(dh)), then the multiplicative 0/1 mask; scale and activation run in place on the
        # fresh product (autograd keeps q and k for it, not the product)
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scaling)
        weights = keep.zero_hidden(activate(scores, self.activation, self.leaky_slope, inplace=True))
        return weighted_values(weights, v, self.attn_dropout, self.training, need_weights=ctx.output_attentions)

    def normalise(self, o):
        """LN(o) of Eq. 4-5 over the merged heads ``[B,T,d]`` (o itself without a norm: ReLU attention alone)."""
        if self.norm == "none":
            return o
        return rela_norm(o, self.norm, self.eps, *self.norm_params())

    def project_out(self, o):
        # training: out_proj(LN(o)) as one autograd node that keeps o alone (`NormThenProject`); out_proj wrapped by
        # something else (an adapter, a hook) keeps its own forward
        if self.norm == "none":
            return self.out_proj(o)
        if not torch.is_grad_enabled() or type(self.out_proj) is not nn.Linear:
            return self.out_proj(self.normalise(o))
        return NormThenProject.apply(o, self.out_proj.weight, self.out_proj.bias, self.norm, self.eps,
                                     *self.norm_params())

    def norm_params(self):
        """(gain, LayerNorm bias or None, gate weight or None) of LN (Eq. 4-5)."""
        return (self.rela_gain, self.rela_bias if self.norm == "layernorm" else None,
                self.rela_gate_weight if self.gated else None)


def rela_norm(o, norm, eps, gain, bias, gate_weight):
    """LN(o) of Eq. 4-5 over the concatenated heads, computed in float32 (even under autocast), in o's dtype.

    RMSNorm (Eq. 4) or LayerNorm (Table 1 row 8), then the sigmoid gate of ReLA-g (Eq. 5), which reads the
    un-normalised input. A float16/bfloat16 o is not copied to float32: its statistic accumulates in float32
    (`mean_square`) and its products with that statistic and the float32 parameters are float32 by type promotion;
    one cast back to o's dtype at the end.
    """
    with float32_autocast_off(o):
        y = _rela_norm32(o, norm, eps, gain.float(), bias, gate_weight)
    return y if y.dtype == o.dtype else y.to(o.dtype)


def mean_square(o: torch.Tensor) -> torch.Tensor:
    """mean(o^2) over the last axis, float32 ``[..., 1]``: accumulated in float32 also for a float16/bfloat16 o."""
    if o.dtype == torch.float32:
        return o.square().mean(-1, keepdim=True)
    return torch.linalg.vector_norm(o, dim=-1, keepdim=True, dtype=torch.float32).square() / o.shape[-1]


def _rela_norm32(o, norm, eps, gain, bias, gate_weight):
    """`rela_norm` in float32 (o in its own dtype, ``gain`` float32); in place where nothing needs a gradient (this
    runs at every decoding step, where it is 30% faster than F.rms_norm on CPU)."""
    grad = torch.is_grad_enabled()
    if norm == "rmsnorm":  # Eq. 4: z / RMS(z) * g, 1 / RMS(z) = (mean(z^2) + eps)^-1/2
        if grad:
            y = o * torch.rsqrt(mean_square(o) + eps) * gain
        else:
            y = torch.mul(o, mean_square(o).add_(eps).rsqrt_()).mul_(gain)
    else:
        y = F.layer_norm(o.float(), (o.shape[-1],), gain, bias.float(), eps)
    if gate_weight is None:
        return y
    if grad:
        return y * torch.sigmoid(gate_weight.float() * o)  # Eq. 5
    return y.mul_(torch.mul(gate_weight.float(), o).sigmoid_())


def norm_parts(z, norm, eps, gain, bias, gate_weight):
    """The float32 pieces of LN(z) = n * s that `NormThenProject`'s backward recomputes (z in its own dtype:
    float16/bfloat16 is promoted, not copied): zhat = (z - mean) / RMS (Eq. 4; the mean only for LayerNorm),
    r = 1 / RMS, n = zhat * g (+ bias), and the gate s = sigmoid(w * z) of Eq. 5 (None without the gate)."""
    centred = z if norm == "rmsnorm" else z - z.mean(-1, keepdim=True, dtype=torch.float32)
    # 1 / RMS = (||z||^2 / d + eps)^-1/2, Eq. 4 (LayerNorm: 1 / std); the norm reads z once, writes nothing big
    norm2 = torch.linalg.vector_norm(centred, dim=-1, keepdim=True, dtype=torch.float32).square_()
    r = norm2.div_(z.shape[-1]).add_(eps).rsqrt_()
    zhat = centred * r
    n = zhat * gain.float() if bias is None else torch.addcmul(bias.float(), zhat, gain.float())
    s = None if gate_weight is None else torch.sigmoid(gate_weight.float() * z)  # Eq. 5
    return zhat, r, n, s


class NormThenProject(torch.autograd.Function):
    """``out_proj(LN(o))`` (Eq. 3-5) that keeps only o for backward, which recomputes the elementwise LN(o) instead
    of storing it: one ``[B,T,d]`` tensor per attention site, as much as softmax attention keeps for its out_proj.
    The matmuls run once each, in the dtype out_proj runs in (autocast's, when on), as nn.Linear's do; the weight cast
    to that dtype is kept for backward (as autocast's cast is for nn.Linear), not cast again. LN's gradient is written
    out (torch.compile traces it into one graph, which ``torch.autograd.grad`` would break), in float32, reading o and
    the upstream gradient in their own dtypes (type promotion, no float32 copies)."""

    @staticmethod
    def forward(ctx, o, weight, bias, norm, eps, gain, norm_bias, gate_weight):
        device = o.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else o.dtype
        w = weight.to(dtype)
        ctx.norm, ctx.eps, ctx.weight_dtype = norm, eps, weight.dtype
        ctx.save_for_backward(o, w, gain, norm_bias, gate_weight)
        y = rela_norm(o, norm, eps, gain, norm_bias, gate_weight)
        return F.linear(y if y.dtype == dtype else y.to(dtype), w, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        o, w, gain, norm_bias, gate_weight = ctx.saved_tensors
        need = ctx.needs_input_grad
        rows = tuple(range(grad.dim() - 1))
        with float32_autocast_off(o):
            g = gain.float()
            zhat, r, n, s = norm_parts(o, ctx.norm, ctx.eps, gain, norm_bias, gate_weight)
            y32 = n if s is None else n * s
            grad_weight = grad_bias = None
            if need[1]:  # LN(o) as the forward gave it to out_proj
                y = y32.to(w.dtype)
                grad_weight = (grad.flatten(0, -2).T @ y.flatten(0, -2)).to(ctx.weight_dtype)
            if need[2]:
                grad_bias = grad.sum(rows, dtype=ctx.weight_dtype)
            gy = grad @ w  # out_proj's dtype; promoted to float32 by the float32 factors below
            gn = gy if s is None else gy * s
            grad_gain = (gn * zhat).sum(rows).to(gain.dtype) if need[5] else None
            grad_norm_bias = gn.sum(rows, dtype=torch.float32).to(norm_bias.dtype) if need[6] else None
            grad_gate = grad_z = None
            if s is not None:  # y = n * sigmoid(w * z): d y / d(w * z) = n * s * (1 - s) = y * (1 - s)
                gate_pre = gy * y32
                gate_pre.addcmul_(gate_pre, s, value=-1)
                grad_gate = (gate_pre * o).sum(rows).to(gate_weight.dtype) if need[7] else None
            if need[0]:  # through zhat = centred / RMS(centred): r * (gzhat - zhat * mean(gzhat * zhat))
                grad_z = gn * g
                dot = (grad_z * zhat).mean(-1, keepdim=True)
                if ctx.norm == "layernorm":
                    grad_z.sub_(grad_z.mean(-1, keepdim=True))
                grad_z.addcmul_(zhat, dot, value=-1).mul_(r)
                if s is not None:  # and through the gate's input z
                    grad_z.addcmul_(gate_pre, gate_weight.float())
        grad_o = grad_z.to(o.dtype) if need[0] else None
        return grad_o, grad_weight, grad_bias, None, None, grad_gain, grad_norm_bias, grad_gate
