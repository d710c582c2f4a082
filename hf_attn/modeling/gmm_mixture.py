"""The Gaussian mixture over source positions of GMM cross-attention (Zhang & Feng 2021, Eq. 6 and Table 1): the
source geometry it reads, each component's log density and the mixture beta with its hand-written gradient.
`attention_gmm.GmmAttention` computes the mixture's parameters and fuses beta with dot-product attention. Ships
flat to the Hub with the model (sibling imports only)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


# synthesis network: caps that keep an unnormalised mixture finite (also in fp16): sum_k w_k <= e^8 ~ 3000, and
# a centre moves at most e^10 positions per target token.
SYNTHESIS_MAX_LOG_WEIGHT = 8.0
SYNTHESIS_MAX_LOG_STEP = 10.0
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
# Z's constant factor per normalisation (`SourceGeometry.scale`): 1 / Z_k = scale / width_k, width as in
# `mixture_parameters` (approximate: 3 sigma; strict: sigma; synthesis: Z = 1)
NORMALIZATION_SCALE = {"approximate": 3 * math.exp(-_LOG_SQRT_2PI), "strict": math.exp(-_LOG_SQRT_2PI),
                       "synthesis": 1.0}
# floor on each component's log density at a source position (`mixture_attention`); not in Zhang & Feng 2021
LOG_DENSITY_FLOOR = -60.0


class SourceGeometry(NamedTuple):
    """What Eq. 6 and 11-12 read from the source, ``[B|1, 1, 1, S]`` (``length``, ``length_2``: ``[B|1, 1, 1, 1]``);
    views of one tensor, which the decoding state keeps."""

    scale: torch.Tensor  # Z's constant factor on real source tokens: 3/sqrt(2 pi) (approximate; strict: 1/sqrt(2 pi);
    # synthesis: 1); 0 on padding
    pos: torch.Tensor  # j: 0-based position among the real tokens (skips left padding)
    length: torch.Tensor  # J: number of real tokens (Eq. 11)
    length_2: torch.Tensor  # J / 2 (Eq. 12 times 3)
    visible: torch.Tensor  # 1 on the keys a row may attend to (every key for an all-padding row: no NaN)
    bias: torch.Tensor  # 0 on visible keys, the dtype's minimum elsewhere (the dot product's mask, Eq. 1-2)


def log_densities(log_coef, mu, r, c, pos, offsets: bool = False):
    """log(w_k / Z_k) - (j - mu_k)^2 / (2 sigma_k^2) per component k and source position j, [..., K, S] (Eq. 6 in
    logs), written log_coef_k - c z^2 with z = (j - mu_k) r_k (`GmmAttention.mixture_parameters` gives log_coef, mu,
    r and c per normalisation; Z's constant factor is in the geometry's ``scale``) and floored at
    `LOG_DENSITY_FLOOR`; with ``offsets`` also j - mu_k (else None).

    j - mu first: j r - mu r would lose digits to cancellation near the centre. The floor is not in the paper:
    e^-60 ~ 1e-26 is 0 next to any attention weight in float32, and it keeps exp off the CPU's underflow path
    (below about -87 torch.exp runs 8-30x slower; most positions of a concentrated component are far below it)."""
    grad = torch.is_grad_enabled()
    d = pos[..., None, :] - mu[..., None]
    z = d * r[..., None] if grad or offsets else d.mul_(r[..., None])  # without autograd, fresh tensors change in place
    logits = torch.addcmul(log_coef[..., None], z, z, value=-c)
    logits = logits.clamp(min=LOG_DENSITY_FLOOR) if grad else logits.clamp_(min=LOG_DENSITY_FLOOR)
    return logits, (d if offsets else None)


class MixtureDensity(torch.autograd.Function):
    """beta_j = scale_j sum_k exp(L_kj), L_kj = log_coef_k - c r_k^2 (j - mu_k)^2 (Eq. 6; `log_densities`), [..., S],
    with its gradient written out: autograd's chain over the [..., K, S] tensors (sub, mul, addcmul, clamp, exp,
    sum and their backwards, about 20 passes) becomes 6 passes forward and 6 backward. With d = j - mu:
        dL/dlog_coef = 1,   dL/dmu = 2 c r^2 d,   dL/dr = -2 c r d^2
    Where the floor holds, L is constant, so its true gradient is 0; here those positions pass their e^-60 share
    (below 1e-25 of the incoming gradient) instead, which saves a mask pass."""

    @staticmethod
    def evaluate(log_coef, mu, r, c, pos, scale, offsets: bool = False):
        """(beta, the densities exp(L) [..., K, S], j - mu with ``offsets`` else None), without autograd."""
        with torch.no_grad():
            logits, d = log_densities(log_coef, mu, r, c, pos, offsets=offsets)
            dens = logits.exp_()
            return dens.sum(-2).mul_(scale), dens, d

    @staticmethod
    def forward(ctx, log_coef, mu, r, c, pos, scale):
        beta, dens, d = MixtureDensity.evaluate(log_coef, mu, r, c, pos, scale, offsets=any(ctx.needs_input_grad[1:3]))
        ctx.c = c
        ctx.save_for_backward(dens, d, r, scale)
        return beta

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        dens, d, r, scale = ctx.saved_tensors
        g = dens * (grad * scale)[..., None, :]  # dloss/dL, [..., K, S]
        d_log_coef, d_mu, d_r = g.sum(-1), None, None
        if d is not None:
            g_d = g.mul_(d).sum(-1)  # sum_j g d
            g_d2 = g.mul_(d).sum(-1)  # sum_j g d^2
            two_c_r = (2 * ctx.c) * r
            d_mu, d_r = two_c_r * r * g_d, -two_c_r * g_d2
        return d_log_coef, d_mu, d_r, None, None, None
