"""Which keys each query may attend to: `KeepMask` and the ``"hf_attn"`` mask function.

The model runs under its own attention implementation name, ``"hf_attn"`` (`kernels.register`), whose mask function
(`keep_mask_interface`) returns a `KeepMask` (True = may attend): key padding ``[B, S]`` + a causal flag + the query
offset, not a dense ``[B, 1, T, S]`` tensor (transformers would otherwise hand a custom implementation no mask at all,
and SDPA's mask is None when nothing is padded). Every variant's ``attend`` reads it through its small API
(`KeepMask.sdpa_mask`, `fill_hidden`, `zero_hidden`, `block`, `real_keys`, `visible_keys`, `dense`); what it builds
(the dense bool ``[B|1, 1, T, S]`` mask, the fill mask, the SDPA mask) is built once per stack and shared by its
layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.masking_utils import (
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)


@dataclass(frozen=True, eq=False)
class KeepMask:
    """Which keys each query may attend to, without materialising ``[B, 1, T, S]`` unless a variant asks for it.

    Compact form: ``padding`` ``[B, S]`` (True = real key; None = every key real) and ``causal`` (query i sees the
    keys at positions <= i + ``offset``; ``offset`` = the cache length during incremental decoding). Any other
    pattern (a 4-D mask given by the caller) is held as ``explicit``, a dense bool ``[B|1, 1|H, T, S]``.
    """

    q_len: int
    k_len: int
    padding: torch.Tensor | None = None
    causal: bool = False
    offset: int = 0
    explicit: torch.Tensor | None = None
    home: torch.device | None = None  # where masks are built when no tensor is held (causal only: no padding)

    @classmethod
    def from_dense(cls, mask: torch.Tensor) -> KeepMask:
        """A `KeepMask` holding a dense bool mask ``[B|1, 1|H, T, S]`` as given."""
        return cls(mask.shape[-2], mask.shape[-1], explicit=mask)

    @property
    def device(self) -> torch.device:
        held = self.explicit if self.explicit is not None else self.padding
        return held.device if held is not None else self.home or torch.device("cpu")

    @property
    def all_visible(self) -> bool:
        """True when every query may see every key (no padding; causal only where even the last key is visible)."""
        if self.explicit is not None or self.padding is not None:
            return False
        return not self.causal or self.k_len - 1 <= self.offset

    def block(self, q0: int, q1: int, k0: int, k1: int, device=None) -> torch.Tensor | None:
        """The keep mask of queries ``q0:q1`` x keys ``k0:k1`` (bool ``[B|1, 1, tq, tk]``), or None when the whole
        block is visible."""
        if self.explicit is not None:
            return self.explicit[..., q0:q1, k0:k1]
        mask = None
        if self.causal and k1 - 1 > q0 + self.offset:  # some key lies after the first query's position
            device = device or self.device
            rows = torch.arange(q0, q1, device=device)[:, None] + self.offset
            mask = (torch.arange(k0, k1, device=device)[None, :] <= rows)[None, None]
        if self.padding is not None:
            real = self.padding[:, None, None, k0:k1]
            mask = real if mask is None else mask & real
        return mask

    def zero_hidden(self, weights: torch.Tensor) -> torch.Tensor:
        """``weights`` ``[B, H, T, S]`` times the 0/1 keep mask (a broadcast block; unchanged when every key is
        visible): the multiplicative masking of the ReLU family."""
        if weights.shape[-2:] == (self.q_len, self.k_len):  # the whole mask: as 0/1 in weights' dtype, built once
            if self.all_visible:
                return weights
            # (a product, not masked_fill: 3x faster on CPU for a broadcast mask; the same values and gradients)
            name = f"_keep_{str(weights.dtype).split('.')[-1]}"
            return weights * self._once(name, lambda: self.block(0, self.q_len, 0, self.k_len).to(weights.dtype))
        mask = self.block(0, weights.shape[-2], 0, weights.shape[-1], device=weights.device)
        return weights if mask is None else weights * mask

    def fill_hidden(self, scores: torch.Tensor, value: float) -> torch.Tensor:
        """``scores`` ``[.., T, S]`` with ``value`` where a key is hidden (`hidden`); unchanged (no op at all) when
        every key is visible: the additive-style masking of the softmax family."""
        return scores if self.all_visible else scores.masked_fill(self.hidden(), value)

    def scale_and_fill(self, scores: torch.Tensor, scale: float, value: float) -> torch.Tensor:
        """``fill_hidden(scores * scale, value)`` in one op: ``scale * scores`` plus a bias (0 on visible keys,
        ``value`` on hidden ones; built once per dtype and value). ``value`` is a large negative fill, which absorbs
        the scaled score it is added to."""
        if self.all_visible:
            return scores * scale
        return torch.add(self._additive(scores.dtype, value), scores, alpha=scale)

    def real_keys(self) -> torch.Tensor:
        """True on the keys some query may attend to (bool ``[B|1, 1|H, 1, S]``, built once): a cross-attention
        mask's source padding."""
        return self._once("_real_keys", self._build_real_keys)

    def _build_real_keys(self) -> torch.Tensor:
        if self.explicit is None and not self.causal:
            if self.padding is None:
                return torch.ones(1, 1, 1, self.k_len, dtype=torch.bool, device=self.device)
            return self.padding[:, None, None, :]
        mask = self.block(0, self.q_len, 0, self.k_len)
        if mask is None:
            return torch.ones(1, 1, 1, self.k_len, dtype=torch.bool, device=self.device)
        return mask.any(dim=-2, keepdim=True)

    def right_padded(self) -> bool:
        """True when no sequence has a hidden key before a real one (`real_keys`: padding on the right, or none).
        Known without looking at the mask when it holds neither padding nor an explicit pattern; else one host check
        (a device sync on a GPU), once per mask object, which a stack's layers share."""
        if self.explicit is None and self.padding is None:
            return True
        return self._once("_right_padded", self._build_right_padded)

    def _build_right_padded(self) -> bool:
        real = self.real_keys()
        return real.shape[-1] <= 1 or not bool((real[..., 1:] & ~real[..., :-1]).any())

    def block_hidden(self, q0: int, q1: int, k0: int) -> bool:
        """True when no query of ``q0:q1`` may see any key from ``k0`` on (causal blocks above the diagonal)."""
        return self.explicit is None and self.causal and k0 > q1 - 1 + self.offset

    def _once(self, name: str, build) -> torch.Tensor:
        """``build()``, computed on the first call and kept on this (frozen) object; by hand, because
        ``functools.cached_property`` takes a lock on Python < 3.12, which ``torch.compile`` cannot trace."""
        if name not in self.__dict__:
            object.__setattr__(self, name, build())
        return self.__dict__[name]

    def dense(self) -> torch.Tensor:
        """The bool mask ``[B|1, 1|H, T, S]``, built once (every layer of a stack shares this object)."""
        return self._once("_dense", self._build_dense)

    def hidden(self) -> torch.Tensor:
        """True where a score must be filled (bool, broadcastable to ``[B, H, T, S]``, built once): the keys a query
        may not see, except on a row with no visible key, which sees every key (see `nonempty`)."""
        return self._once("_hidden", self._build_hidden)

    def _build_hidden(self) -> torch.Tensor:
        mask = self.block(0, self.q_len, 0, self.k_len)
        if mask is None:
            return torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=self.device)
        return ~nonempty(mask)

    def _build_dense(self) -> torch.Tensor:
        mask = self.block(0, self.q_len, 0, self.k_len)
        if mask is None:
            mask = torch.ones(1, 1, self.q_len, self.k_len, dtype=torch.bool, device=self.device)
        return mask.expand(-1, -1, self.q_len, self.k_len)

    def visible_keys(self) -> torch.Tensor:
        """n per query, ``[B|1, 1, T, 1]`` (int64): how many keys each query may attend to (built once, as `dense`)."""
        return self._once("_visible_keys", self._build_visible_keys)

    def _build_visible_keys(self) -> torch.Tensor:
        if self.explicit is not None:
            return self.explicit.sum(-1, keepdim=True)
        if not self.causal:
            if self.padding is None:
                return torch.full((1, 1, self.q_len, 1), self.k_len, device=self.device)
            return self.padding.sum(-1).view(-1, 1, 1, 1).expand(-1, -1, self.q_len, -1)
        last = (torch.arange(self.q_len, device=self.device) + self.offset).clamp(max=self.k_len - 1)
        if self.padding is None:
            return (last + 1).view(1, 1, -1, 1)
        return self.padding.long().cumsum(-1)[:, last].view(-1, 1, self.q_len, 1)

    def sdpa_mask(self, dtype: torch.dtype) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal) for `F.scaled_dot_product_attention` in its cheapest form: no mask when all is
        visible, ``is_causal`` for plain causal self-attention, else an additive ``dtype`` mask (0 / -inf, what SDPA
        would make of a bool one), broadcast ``[B, 1, 1, S]`` for padding alone, built once for all the layers. A
        row with no visible key (a fully padded sequence) sees every key instead: no NaN (its output is discarded)."""
        if self.all_visible:
            return None, False
        if self.explicit is None and self.padding is None and self.offset == 0 and self.q_len == self.k_len:
            return None, True
        return self._additive(dtype, float("-inf")), False

    def _additive(self, dtype: torch.dtype, value: float) -> torch.Tensor:
        """0 on the visible keys, ``value`` on the hidden ones (`hidden`), in ``dtype``: built once per dtype and
        value (the SDPA mask, `scale_and_fill`'s bias)."""
        # (an attribute name without dots: dynamo cannot trace a dotted one)
        name = f"_additive_{str(dtype).split('.')[-1]}_{abs(value):.6e}".replace("+", "").replace(".", "_")
        return self._once(name, lambda: torch.zeros(self.hidden().shape, dtype=dtype, device=self.device)
                          .masked_fill_(self.hidden(), value))

    def last_keys(self, k_len: int) -> KeepMask:
        """The mask restricted to the last ``k_len`` keys (for a mask built over a longer key axis)."""
        if k_len == self.k_len:
            return self
        if self.explicit is not None:
            return KeepMask.from_dense(self.explicit[..., -k_len:])
        padding = None if self.padding is None else self.padding[:, -k_len:]
        return KeepMask(self.q_len, k_len, padding, self.causal, self.offset - (self.k_len - k_len), home=self.home)


def keep_mask_interface(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, cache_position=None, **kwargs) -> KeepMask:
    """Mask function for ``_attn_implementation="hf_attn"``: a compact `KeepMask` from the 2-D padding mask and
    causality; other patterns (custom mask functions) are materialised by transformers' `sdpa_mask`, held dense.

    transformers 5.0-5.3 give the queries' positions (``cache_position``, consecutive) instead of ``q_length`` and
    ``q_offset`` (5.4 replaced them in every mask interface call, masking_utils)."""
    queries = dict(q_length=q_length, q_offset=q_offset)
    if cache_position is not None:
        queries = dict(cache_position=cache_position)
        q_length = cache_position.shape[0]
        q_offset = int(cache_position[0]) if q_length else 0
    if mask_function in (causal_mask_function, bidirectional_mask_function) and kv_offset == 0 and local_size is None:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is not None:
            padding = padding.bool()
            if not torch.compiler.is_compiling():  # (a host check: a compiled graph keeps the mask, same result)
                padding = None if padding.all() else padding
        device = kwargs.get("device", None if cache_position is None else cache_position.device)
        return KeepMask(q_length, kv_length, padding, mask_function is causal_mask_function, q_offset,
                        home=torch.device(device) if device is not None else None)
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    kwargs.pop("dtype", None)
    kwargs.pop("config", None)
    dense = sdpa_mask(batch_size=batch_size, kv_length=kv_length, kv_offset=kv_offset, mask_function=mask_function,
                      attention_mask=attention_mask, local_size=local_size, **queries, **kwargs)
    return KeepMask.from_dense(dense)


def nonempty(keep: torch.Tensor) -> torch.Tensor:
    """Let rows with no visible key see every key (their output is discarded anyway: a fully padded sequence).

    Avoids the NaN that softmax/SDPA give, and the crash entmax gives, on an all-masked row.
    """
    return keep | ~keep.any(dim=-1, keepdim=True)



def is_prepared_keep_mask(mask) -> bool:
    """True for a `KeepMask` built by the mask function, possibly of another copy of this module: a process that
    imports hf_attn and also loads a model with trust_remote_code holds two, and the mask function registered last
    under "hf_attn" builds the masks of both (so no ``isinstance(mask, KeepMask)``)."""
    return mask is not None and not isinstance(mask, torch.Tensor)


def keep_from_mask(attention_mask, q_len: int, k_len: int, is_causal: bool, device=None) -> KeepMask:
    """Turn whatever mask transformers hands a layer into a `KeepMask` over ``k_len`` keys.

    A `KeepMask` (our implementation) passes through; bool masks are held dense, additive float masks (eager) become
    ``mask > min/2``; ``None`` (sdpa without padding) is all visible, or causal with the cache offset ``S - T`` for
    causal self-attention.
    """
    if is_prepared_keep_mask(attention_mask):
        return attention_mask.last_keys(k_len)
    if attention_mask is None:
        return KeepMask(q_len, k_len, causal=is_causal, offset=k_len - q_len, home=device)
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return KeepMask.from_dense(attention_mask[..., -k_len:])
