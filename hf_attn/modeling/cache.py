"""Decoding state: the K/V cache as transformers' stock attention keeps it (`project_with_cache`, `query_offset`)
and `HfAttnCache`, which also holds the variants' per-hypothesis state."""

from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import DynamicLayer, EncoderDecoderCache
from transformers.models.bart.modeling_bart import BartAttention

# the name under which transformers hands the K/V cache to every forward: ``cache`` since 5.24, ``past_key_values``
# before (the layers pass it by keyword; the modules and the model accept both)
CACHE_KWARG = "cache" if "cache" in inspect.signature(BartAttention.forward).parameters else "past_key_values"


def pop_cache(cache, kwargs: dict):
    """The cache a forward was given, under either name (``cache``, or ``past_key_values`` before 5.24)."""
    legacy = kwargs.pop("past_key_values", None)
    return legacy if cache is None else cache


class HfAttnCache(EncoderDecoderCache):
    """`EncoderDecoderCache` that also holds the variants' per-hypothesis decoding state (GMM synthesis network's
    last centre, attention calibration's projected keys), batch-first tensors reordered, repeated, selected and
    cropped together with the keys and values. The model wraps any `EncoderDecoderCache` it is given in one."""

    def __init__(self, *caches) -> None:
        super().__init__(*caches)
        self.variant_state: dict[str, tuple[torch.Tensor, int | None]] = {}
        # (the cross-attention and source-side state tensors, the run of equal rows each row belongs to): see
        # `_keeps_source_rows`
        self._source_runs: tuple[tuple[torch.Tensor, ...], torch.Tensor] | None = None

    @classmethod
    def wrap(cls, cache: EncoderDecoderCache) -> HfAttnCache:
        if isinstance(cache, cls):
            return cache
        new = cls(cache.self_attention_cache, cache.cross_attention_cache)
        new.is_updated = cache.is_updated
        return new

    def get_state(self, name: str) -> torch.Tensor | None:
        entry = self.variant_state.get(name)
        return None if entry is None else entry[0]

    def set_state(self, name: str, value: torch.Tensor, target_dim: int | None = None) -> None:
        """``target_dim``: the axis over target positions, cut by `crop`; None for source-side state."""
        self.variant_state[name] = (value, target_dim)

    def _map_state(self, fn, source_side: bool = True) -> None:
        """Apply ``fn`` to every state tensor; with ``source_side=False`` only to those over target positions."""
        self.variant_state = {k: (fn(t) if source_side or d is not None else t, d)
                              for k, (t, d) in self.variant_state.items()}

    def reset(self):
        super().reset()
        self.variant_state = {}
        self._source_runs = None

    def reorder_cache(self, beam_idx: torch.LongTensor):
        """Beam search's reordering. Each hypothesis stays within its sentence's rows (``generate`` never reorders the
        encoder's attention mask either), and those rows' cross-attention keys and values are equal: the encoder
        output repeated per beam. A reordering that maps every row onto an equal one leaves the cross-attention
        cache and the source-side state as they are instead of copying them (two ``index_select`` per layer and
        step, about 3% of a beam search on CPU); any other reordering copies them, as `EncoderDecoderCache` does."""
        self.self_attention_cache.reorder_cache(beam_idx)
        same_sources = self._keeps_source_rows(beam_idx)
        if not same_sources:
            self.cross_attention_cache.reorder_cache(beam_idx)
        self._map_state(lambda t: t.index_select(0, beam_idx.to(t.device)), source_side=not same_sources)

    def _keeps_source_rows(self, beam_idx: torch.LongTensor) -> bool:
        """True when row ``beam_idx[i]`` of every cross-attention key and value tensor and of every source-side
        state tensor equals row i (bitwise)."""
        layers = self.cross_attention_cache.layers
        if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
            return False  # static, offloaded, quantised layers: update in place or elsewhere; reorder as stock does
        tensors = tuple(t for layer in layers for t in (layer.keys, layer.values))
        tensors += tuple(t for _, (t, dim) in sorted(self.variant_state.items()) if dim is None)
        if any(t.shape[0] != tensors[0].shape[0] for t in tensors):
            return False
        known = self._source_runs
        if known is None or len(known[0]) != len(tensors) or any(a is not b for a, b in zip(known[0], tensors)):
            # dynamic layers replace their tensors on every update: identity says whether these runs are current.
            # runs[i] numbers the run of consecutive equal rows that row i belongs to
            n = tensors[0].shape[0]
            same = torch.ones(max(n - 1, 0), dtype=torch.bool, device=tensors[0].device)
            for t in tensors if n > 1 else ():
                same &= (t[1:] == t[:-1]).reshape(n - 1, -1).all(1)
            runs = torch.cat([same.new_zeros(min(n, 1), dtype=torch.long), (~same).long().cumsum(0)])
            self._source_runs = known = (tensors, runs)
        runs = known[1]
        if beam_idx.shape != runs.shape:
            return False
        return torch.equal(runs.index_select(0, beam_idx.to(runs.device)), runs)

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        self._source_runs = None  # (drops the references to the tensors it replaced)
        self._map_state(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        self._source_runs = None
        self._map_state(lambda t: t[indices])

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if tokens_to_remove < 0:
            self.variant_state = {k: (t.narrow(d, 0, t.shape[d] + tokens_to_remove) if d is not None else t, d)
                                  for k, (t, d) in self.variant_state.items()}


# BartAttention.forward's K/V-cache logic (transformers 5.23, models/bart/modeling_bart.py; Marian's is the same),
# in one place. `keys=False`: no key projection, for the position-only variants. tests/modeling/test_cache.py checks that
# the cache this builds equals the stock attention's.
def project_with_cache(module, hidden_states, key_value_states, past_key_values, keys: bool = True):
    """(k ``[B,H,S,dh]`` or None, v ``[B,H,S,dh]``), including the cached positions; updates the cache."""
    is_cross = key_value_states is not None
    cache, is_updated = None, False
    if past_key_values is not None:
        if isinstance(past_key_values, EncoderDecoderCache):
            is_updated = past_key_values.is_updated.get(module.layer_idx)
            cache = past_key_values.cross_attention_cache if is_cross else past_key_values.self_attention_cache
        else:
            cache = past_key_values
    current = key_value_states if is_cross else hidden_states
    if is_cross and cache is not None and is_updated:
        layer = cache.layers[module.layer_idx]
        return (layer.keys if keys else None), layer.values
    shape = (*current.shape[:-1], -1, module.head_dim)
    v = module.v_proj(current).view(shape).transpose(1, 2)
    k = module.k_proj(current).view(shape).transpose(1, 2) if keys else None
    if cache is not None:
        # the position-only variants have no key projection: zeros in the standard [B, H, S, dh] key slot keep every
        # cache consumer working (static caches, assisted decoding, code that reads the cache's shapes)
        k, v = cache.update(torch.zeros_like(v) if k is None else k, v, module.layer_idx)
        if is_cross and isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.is_updated[module.layer_idx] = True
    return (k if keys else None), v


def query_offset(past_key_values, is_cross: bool, layer_idx: int, tgt_len: int) -> int:
    """Target positions before this call, read from the decoder's self-attention cache *before* this module updates
    it: its length for self-attention; for cross-attention (after this layer's self-attention added the current
    positions) its length minus ``tgt_len``. A static cache's keys span its full size, so the length must come
    from the cache, not from the keys' shape."""
    if past_key_values is None or (is_cross and not isinstance(past_key_values, EncoderDecoderCache)):
        return 0
    cache = past_key_values
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
    past = int(cache.get_seq_length(layer_idx)) - (tgt_len if is_cross else 0)
    return max(past, 0)
