"""The softmax kernel and the steps every variant shares, and the ``"hf_attn"`` attention implementation.

`register` adds ``"hf_attn"`` to transformers' `AttentionInterface` (softmax attention, for modules that kept the
stock attention class) and `AttentionMaskInterface` (`masking.keep_mask_interface`); the config and model classes
call it, once per process.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .masking import KeepMask, keep_from_mask, keep_mask_interface

ATTN_IMPLEMENTATION = "hf_attn"


def softmax_attention(q, k, v, keep: KeepMask, scaling, dropout, need_weights):
    """Standard softmax attention, Vaswani et al. 2017 Eq. 1: softmax(q k^T / sqrt(dh)) V.

    Uses SDPA (with the cheapest equivalent mask, `KeepMask.sdpa_mask`) unless the weights are requested (then the
    eager path, with identical math).
    """
    if not need_weights:
        mask, is_causal = keep.sdpa_mask(q.dtype)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal,
                                             scale=scaling)
        return ctx, None
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    scores = keep.fill_hidden(scores, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return weighted_values(weights, v, dropout, dropout > 0, need_weights=True)


def weighted_values(weights, v, dropout: float, training: bool, need_weights: bool):
    """ctx = dropout(weights) V (the last step of every variant), with weights ``[H|1|B, ..., T, S]`` broadcast
    to ``[B, H, T, S]``; returns (ctx, weights or None)."""
    if weights.dtype != v.dtype:
        weights = weights.to(v.dtype)
    if weights.dim() == 3:
        weights = weights.unsqueeze(0)
    if weights.shape[:2] != v.shape[:2]:
        weights = weights.expand(v.shape[0], v.shape[1], *weights.shape[-2:])
    if training and dropout > 0:
        weights = F.dropout(weights, p=dropout, training=True)
    ctx = torch.matmul(weights, v)
    return ctx, (weights if need_weights else None)


def hf_attn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """`AttentionInterface` entry for modules that kept the stock attention class (returns ``[B,T,H,dh]``)."""
    keep = keep_from_mask(attention_mask, query.shape[2], key.shape[2], getattr(module, "is_causal", False),
                          device=query.device)
    ctx, weights = softmax_attention(
        query, key, value, keep, scaling or query.shape[-1] ** -0.5, dropout, bool(kwargs.get("output_attentions"))
    )
    return ctx.transpose(1, 2).contiguous(), weights




_registered = False


def register() -> None:
    """Register ``"hf_attn"`` with transformers' attention and mask interfaces (idempotent: once per process and
    copy of this module; a model loaded with trust_remote_code registers its own copy, see
    `masking.is_prepared_keep_mask`)."""
    global _registered
    if not _registered:
        AttentionInterface.register(ATTN_IMPLEMENTATION, hf_attn_attention_forward)
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, keep_mask_interface)
        _registered = True


_NO_CONTEXT = contextlib.nullcontext()


def float32_autocast_off(tensor: torch.Tensor):
    """Context to run custom normalisations in float32 even under fp16/bf16 autocast; a shared no-op context when
    autocast is off for the tensor's device (entering ``torch.autocast`` costs more than a small decoding op)."""
    if not torch.is_autocast_enabled(tensor.device.type):
        return _NO_CONTEXT
    return torch.autocast(device_type=tensor.device.type, enabled=False)
