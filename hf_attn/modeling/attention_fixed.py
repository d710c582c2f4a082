"""Position-only baselines that RAN (Zeng et al. 2021) and GMM cross-attention (Zhang & Feng 2021) compare with.

hard-gaussian  You, Sun & Iyyer 2020, "Hard-Coded Gaussian Attention for Neural Machine Translation" (ACL;
               code: fallcat/stupidNMT). No attention parameters: head h of a layer attends with the fixed
               Gaussian N(c_h(i), sigma^2) over key positions j:
                   w_hij = N(j; c_h(i), sigma^2) = exp(-(j - c_h(i))^2 / (2 sigma^2)) / (sigma sqrt(2 pi))
               encoder: c(i) = i - 1 / i + 1 ; decoder: c(i) = i - 1 / i (heads alternate between the offsets,
               as the authors' code repeats its offset list over the heads) ; sigma = 1 ;
               cross-attention: c(i) = i * r (r = source/target length ratio, hard_gaussian_length_ratio) clamped
               to the real source [0, J-1] (the code does not clamp; past the source end every weight would be ~0).
               As in the authors' code (and as the GMM paper notes), the weights are the density at integer
               positions, masked to 0, *not* renormalised (they sum to about 1 inside the sentence, less at the
               edges and under the causal mask); ``hard_gaussian_normalize=True`` renormalises over visible keys.
               Source positions count real tokens only, so source padding may be on either side.
synthesizer    Tay et al. 2020/2021, "Synthesizer: Rethinking Self-Attention in Transformer Models" (Random
               Synthesizer, Syn-R in the RAN paper): a trainable logits matrix R [H, Lmax, Lmax] per layer,
               p = softmax(R[:, q, :S] masked), out = out_proj(merge(dropout(p) @ v_proj(x))).

Both keep only the value and output projections (see attention_positional.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .attention_positional import (
    PositionalAttention,
    check_length,
    check_right_padding,
    positional_softmax,
)
from .citations import CITATIONS
from .hyperparameters import Hyperparameter, Preset
from .kernels import float32_autocast_off, weighted_values

HC_PAPER = CITATIONS["hard-coded-gaussian"]
SYN_PAPER = CITATIONS["synthesizer"]
GMM_PAPER = CITATIONS["gmm"]
RAN_PAPER = CITATIONS["ran"]
SYNTHESIZER_INITS = ("xavier_uniform", "ones")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


class HardGaussianAttention(PositionalAttention):
    """Fixed Gaussian attention around a per-head offset of the query position (You et al. 2020)."""

    variant = "hard-gaussian"
    description = "hard-coded Gaussian attention: fixed N(i + offset, 1) over positions (You et al. 2020)"
    sites = ("encoder", "decoder", "cross")
    hyperparameters = (
        Hyperparameter("hard_gaussian_std", float, 1.0, "standard deviation sigma of the Gaussians, in positions "
                       "(You et al. 2020: 1)", low=0.0, low_open=True, symbol="sigma"),
        Hyperparameter("hard_gaussian_encoder_offsets", list[int], [-1, 1], "encoder heads' centres i + offset, "
                       "repeated over the heads (You et al. 2020: i-1, i+1)",
                       symbol="the encoder heads' centres i-1, i+1"),
        Hyperparameter("hard_gaussian_decoder_offsets", list[int], [-1, 0], "decoder heads' centres i + offset, "
                       "repeated over the heads; > 0 would be a masked future token (You et al. 2020: i-1, i)", high=0,
                       symbol="the decoder heads' centres i-1, i"),
        Hyperparameter("hard_gaussian_cross_offsets", list[int], [0], "cross-attention heads' centres i * r + "
                       "offset, repeated over the heads (You et al. 2020: i * r)",
                       symbol="the cross-attention heads' centre i * r"),
        Hyperparameter("hard_gaussian_length_ratio", float, 1.0, "r: mean source / target length (the "
                       "word_count_ratio of You et al. 2020's code)", low=0.0, low_open=True, symbol="r"),
        Hyperparameter("hard_gaussian_normalize", bool, False, "renormalise the weights over the visible keys (You "
                       "et al. 2020's code does not)"),
    )
    presets = (
        Preset(
            "hard-gaussian",
            "baseline: hard-coded Gaussian encoder and decoder self-attention, softmax cross-attention "
            "(RAN paper Table 1, HC-SA)",
            f"{HC_PAPER}; as compared in {RAN_PAPER}",
            {"encoder_attention": "hard-gaussian", "decoder_attention": "hard-gaussian", "cross_attention": "softmax"},
        ),
        Preset(
            "hard-gaussian-cross",
            "baseline: hard-coded Gaussian cross-attention, softmax self-attention (GMM paper Table 2, Hard-Code "
            "Gaussian)",
            f"{HC_PAPER}; as compared in {GMM_PAPER}",
            {"encoder_attention": "softmax", "decoder_attention": "softmax", "cross_attention": "hard-gaussian"},
        ),
    )

    def setup(self, config):
        self.std = float(config.hard_gaussian_std)
        offsets = list(getattr(config, f"hard_gaussian_{self.site}_offsets"))
        self.offsets = [float(offsets[h % len(offsets)]) for h in range(self.num_heads)]
        self.length_ratio = float(config.hard_gaussian_length_ratio)
        self.normalize = config.hard_gaussian_normalize

    def attend(self, q, k, v, keep, ctx):
        tgt_len, src_len, past, output_attentions = keep.q_len, v.shape[2], ctx.past, ctx.output_attentions
        with float32_autocast_off(v):
            # [1, H, 1, 1]; copied to a GPU without waiting for it (torch.tensor(..., device=cuda) would sync)
            offsets = torch.tensor(self.offsets)[None, :, None, None].to(v.device, non_blocking=True)
            if self.site == "decoder":  # absolute target positions; the query row is past + t
                key_pos = torch.arange(src_len, device=v.device, dtype=torch.float32)
                query_pos = torch.arange(past, past + tgt_len, device=v.device, dtype=torch.float32)
                centre = query_pos[None, None, :, None] + offsets  # [1, H, T, 1]
            else:  # source positions count the real tokens only (padding may be on either side)
                real = keep.real_keys().float()  # [B, 1, 1, S]
                key_pos = real.cumsum(-1) - 1
                if self.site == "encoder":  # queries are the same tokens: c(i) = pos(i) + offset
                    centre = key_pos.transpose(-1, -2) + offsets  # [B, H, T, 1]
                else:  # c(i) = i * r, clamped to the real source [0, J-1]
                    query_pos = torch.arange(past, past + tgt_len, device=v.device, dtype=torch.float32)
                    last = (real.sum(-1, keepdim=True) - 1).clamp(min=0)  # [B, 1, 1, 1]
                    centre = (query_pos[None, None, :, None] * self.length_ratio + offsets).clamp(min=0)
                    centre = torch.minimum(centre, last)  # [B, H, T, 1]
            # log N(j; c, sigma^2)
            log_density = -(key_pos - centre).square() / (2 * self.std**2) - math.log(self.std) - _LOG_SQRT_2PI
            if self.normalize:
                weights = torch.softmax(keep.fill_hidden(log_density, torch.finfo(torch.float32).min), -1)
            else:  # the authors' code: density at the visible positions, 0 elsewhere
                weights = keep.zero_hidden(log_density.exp())
        return weighted_values(weights, v, self.attn_dropout, self.training, output_attentions)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, offsets={self.offsets}, std={self.std}"


class SynthesizerAttention(PositionalAttention):
    """Random Synthesizer: softmax of a trainable [H, Lmax, Lmax] logits matrix per layer (Tay et al.)."""

    variant = "synthesizer"
    description = "random Synthesizer: a trainable [H, Lmax, Lmax] attention matrix per layer (Tay et al. 2021)"
    sites = ("encoder", "decoder")
    hyperparameters = (
        Hyperparameter("synthesizer_max_positions", int, 256, "Lmax, the size of the learned [H, Lmax, Lmax] logits "
                       "= the longest input (RandomAttention maxlen 256 in the code of Zeng et al. 2021)", low=1),
        Hyperparameter("synthesizer_init", str, "xavier_uniform", "init of the logits R: xavier_uniform (Tay et al. "
                       "2021), or ones = Syn-R of Zeng et al. 2021's code (uniform at start)",
                       choices=SYNTHESIZER_INITS,
                       symbol="R, the Random Synthesizer's logits"),
    )
    presets = (
        Preset(
            "synthesizer",
            "baseline: random Synthesizer in encoder and decoder self-attention, softmax cross-attention "
            "(RAN paper Table 1, Syn-R)",
            f"{SYN_PAPER}; as compared in {RAN_PAPER}",
            {"encoder_attention": "synthesizer", "decoder_attention": "synthesizer", "cross_attention": "softmax"},
        ),
    )

    @classmethod
    def max_positions(cls, config):
        if "synthesizer" in config.attention_layout()["decoder"]:
            return config.synthesizer_max_positions
        return None

    def setup(self, config):
        self.max_len = config.synthesizer_max_positions
        self.init_kind = config.synthesizer_init
        self.synthesizer_logits = nn.Parameter(torch.empty(self.num_heads, self.max_len, self.max_len))  # R

    def init_variant_weights(self, init):
        if self.init_kind == "ones":
            init.ones_(self.synthesizer_logits)
        else:
            init.xavier_uniform_(self.synthesizer_logits)

    def layer_matrix(self, length: int | None = None) -> torch.Tensor:
        """This layer's learned logits R, detached float32 ``[H, length, length]`` (default Lmax)."""
        length = length or self.max_len
        check_length(length, self.max_len, self.variant, "synthesizer_max_positions")
        return self.synthesizer_logits.detach()[:, :length, :length].float().clone()

    def attend(self, q, k, v, keep, ctx):
        tgt_len, src_len, past, output_attentions = keep.q_len, v.shape[2], ctx.past, ctx.output_attentions
        check_length(max(src_len, past + tgt_len), self.max_len, self.variant, "synthesizer_max_positions")
        if past == 0:  # once per input (never per cached decoding step: no device sync)
            check_right_padding(keep, self.variant, self.site)
        logits = self.synthesizer_logits[:, past : past + tgt_len, :src_len]
        return positional_softmax(logits, keep, v, self.attn_dropout, self.training, output_attentions)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_positions={self.max_len}"
