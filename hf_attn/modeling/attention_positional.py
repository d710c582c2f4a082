"""Shared pieces of the position-only attention variants: RAN (`recurrent`), `hard-gaussian`, `synthesizer`.

Their attention weights depend on the query and key *positions* only, never on the tokens, so a layer keeps just
the value and output projections of the base attention class (``uses_keys = False``: ``q_proj`` / ``k_proj`` are
removed, no unused parameters, and the parameter savings the papers report). The K/V cache keeps the standard
format, with zeros in the key slot (`project_with_cache`). ``attend`` gets ``q = k = None``.

Positions: for self-attention, query row ``ctx.past + t`` (``past`` = cached length) against key columns
``0..S-1``. Variants built on learned ``[H, Lmax, Lmax]`` matrices (RAN, Synthesizer) use absolute positions and
therefore need right padding; they check it and raise a clear error otherwise.
"""

from __future__ import annotations

import torch

from .attention_base import VariantAttention
from .hyperparameters import HfAttnConfigError
from .kernels import float32_autocast_off, weighted_values
from .masking import KeepMask


def check_right_padding(keep: KeepMask, variant: str, site: str) -> None:
    """Raise if a sequence has a padding position before a real one (left or middle padding); a key is real when
    some query may attend to it (`KeepMask.right_padded`: checked once per mask, without a device sync where the
    mask holds no padding)."""
    if not keep.right_padded():
        raise HfAttnConfigError(
            f"{variant} attention ({site}) uses absolute positions and needs right padding, but a sequence in this "
            "batch has padding before real tokens; pad on the right (tokenizer.padding_side = 'right')"
        )


def check_length(length: int, limit: int, variant: str, field: str) -> None:
    """Clear error for a sequence longer than a learned ``[H, Lmax, Lmax]`` matrix."""
    if length > limit:
        raise HfAttnConfigError(
            f"{variant} attention got a sequence of {length} positions but {field}={limit} (the size of its learned "
            f"attention matrices); truncate inputs to at most {limit} tokens, or create the model with "
            f"{field} >= {length}"
        )


def positional_softmax(logits, keep, v, dropout: float, training: bool, need_weights: bool):
    """p = softmax(logits) over the visible keys, in float32 (also under autocast); ctx = dropout(p) V.

    ``logits`` ``[H|1, T, S]`` or ``[B, H, T, S]``; ``keep`` the `KeepMask`; ``v`` ``[B, H, S, dh]``.
    """
    with float32_autocast_off(v):
        scores = keep.fill_hidden(logits.float(), torch.finfo(torch.float32).min)
        weights = torch.softmax(scores, dim=-1)
    return weighted_values(weights, v, dropout, training, need_weights)


class PositionalAttention(VariantAttention):
    """Value and output projections only; the weights come from positions (``attend`` gets q = k = None)."""

    uses_keys = False
