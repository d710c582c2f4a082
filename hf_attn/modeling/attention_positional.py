"""Shared machinery of the position-only attention variants: RAN (`recurrent`), `hard-gaussian`, `synthesizer`.

Their attention weights depend on the query and key *positions* only, never on the tokens, so a layer keeps just
the value and output projections of the base attention class (``q_proj`` / ``k_proj`` are removed: no unused
parameters, and the parameter savings the papers report). The KV cache holds V only: the key slot of the cache
gets a ``[B, 1, S, 1]`` zero placeholder, which keeps the cache's length bookkeeping (``get_seq_length``, beam
reordering) working at 1/dh of the cost of real keys.

Positions: for self-attention, query row ``past + t`` (``past`` = cached length) against key columns ``0..S-1``.
Variants built on learned ``[H, Lmax, Lmax]`` matrices (RAN, Synthesizer) use absolute positions and therefore
need right padding; they check it and raise a clear error otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import EncoderDecoderCache

from .attention_base import HfAttnConfigError, VariantAttention, float32_autocast_off, nonempty


def check_right_padding(keep: torch.Tensor, variant: str, site: str) -> None:
    """Raise if a sequence has a padding position before a real one (left or middle padding).

    ``keep`` is the bool keep mask ``[B|1, 1|H, T, S]``; a key is real when some query may attend to it.
    """
    real = keep.any(dim=-2)  # [B, 1, S]
    if real.shape[-1] > 1 and bool((real[..., 1:] & ~real[..., :-1]).any()):
        raise HfAttnConfigError(
            f"{variant} attention ({site}) uses absolute positions and needs right padding, but a sequence in this "
            "batch has padding before real tokens; pad on the right (tokenizer.padding_side = 'right')"
        )


def check_length(length: int, limit: int, variant: str, field: str) -> None:
    """Clear error for a sequence longer than a learned ``[H, Lmax, Lmax]`` matrix."""
    if length > limit:
        raise HfAttnConfigError(
            f"{variant} attention got a sequence of {length} positions but {field}={limit} (the size of its learned "
            f"attention matrices); truncate inputs to at most {limit} tokens (e.g. --max_source_length {limit}), "
            f"or create the model with {field} >= {length}"
        )


def positional_softmax(logits, keep, v, dropout: float, training: bool, need_weights: bool):
    """p = softmax(logits) over the visible keys, in float32 (also under autocast); ctx = dropout(p) V.

    ``logits`` ``[H|1, T, S]`` or ``[B, H, T, S]``; ``keep`` bool ``[B|1, 1|H, T, S]``; ``v`` ``[B, H, S, dh]``.
    """
    with float32_autocast_off(v):
        scores = logits.float().masked_fill(~nonempty(keep), torch.finfo(torch.float32).min)
        weights = torch.softmax(scores, dim=-1)
    return weighted_values(weights, v, dropout, training, need_weights)


def weighted_values(weights, v, dropout: float, training: bool, need_weights: bool):
    """ctx = dropout(weights) V, with weights broadcast to ``[B, H, T, S]``."""
    weights = weights.to(v.dtype)
    if weights.dim() == 3:
        weights = weights.unsqueeze(0)
    weights = weights.expand(v.shape[0], v.shape[1], *weights.shape[-2:])
    ctx = torch.matmul(F.dropout(weights, p=dropout, training=training and dropout > 0), v)
    return ctx, (weights if need_weights else None)


class PositionalAttention(VariantAttention):
    """Value + output projections only; weights from positions. Subclasses implement `positional_attend`."""

    def setup(self, config):
        # no query/key projections: the weights never look at the tokens (one owner, no unused parameters)
        del self.q_proj
        del self.k_proj
        self.setup_positional(config)

    def setup_positional(self, config) -> None:
        """Create the variant's own parameters."""

    # ---- projections and the V-only cache ---------------------------------------------------------------------
    def project_values(self, hidden_states, key_value_states=None, past_key_values=None):
        """(v ``[B,H,S,dh]`` including cached values, past = target positions before this call).

        ``past`` is the query offset: the cached self-attention length (for cross-attention, read from the
        decoder's self-attention cache, which this layer's self-attention has already updated).
        """
        is_cross = key_value_states is not None
        tgt_len = hidden_states.shape[1]
        cache, is_updated = None, False
        if past_key_values is not None:
            if isinstance(past_key_values, EncoderDecoderCache):
                is_updated = past_key_values.is_updated.get(self.layer_idx)
                cache = past_key_values.cross_attention_cache if is_cross else past_key_values.self_attention_cache
            else:
                cache = past_key_values
        current = key_value_states if is_cross else hidden_states
        if is_cross and cache is not None and is_updated:
            v = cache.layers[self.layer_idx].values
        else:
            v = self.v_proj(current).view(*current.shape[:-1], -1, self.head_dim).transpose(1, 2)
            if cache is not None:
                placeholder = v.new_zeros(v.shape[0], 1, v.shape[2], 1)  # keys are never used: V-only cache
                _, v = cache.update(placeholder, v, self.layer_idx)
                if is_cross and isinstance(past_key_values, EncoderDecoderCache):
                    past_key_values.is_updated[self.layer_idx] = True
        if not is_cross:
            past = v.shape[2] - tgt_len
        elif isinstance(past_key_values, EncoderDecoderCache):
            past = past_key_values.self_attention_cache.get_seq_length(self.layer_idx) - tgt_len
        else:
            past = 0
        return v, max(past, 0)

    def forward(self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, **kwargs):
        v, past = self.project_values(hidden_states, key_value_states, past_key_values)
        tgt_len, src_len = hidden_states.shape[1], v.shape[2]
        keep = self.keep_mask(attention_mask, tgt_len, src_len, v.device)
        ctx, weights = self.positional_attend(v, keep, past, bool(kwargs.get("output_attentions")))
        o = ctx.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.out_proj(o), weights

    def attend(self, q, k, v, keep, output_attentions=False):  # the generic path is not used: see forward
        raise NotImplementedError(f"{type(self).__name__} computes its weights from positions (see forward)")

    def positional_attend(self, v, keep, past: int, output_attentions: bool):
        """(context ``[B,H,T,dh]``, weights ``[B,H,T,S]`` or None); queries are positions past..past+T-1."""
        raise NotImplementedError
