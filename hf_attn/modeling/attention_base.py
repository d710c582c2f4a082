"""The attention contract every hf-attn variant follows.

A variant is a *mixin* holding the paper's math; `attention_class(base, mixin)` combines it with the base model's
own attention class (`MarianAttention` or `BartAttention`), so that the q/k/v/out parameter names stay those of a
vanilla checkpoint and transformers' `output_attentions` recorders (which match `isinstance(m, MarianAttention)`)
keep working.

One forward path for every variant (`VariantAttention.forward`): `project` (q/k/v and the K/V cache, as
`BartAttention.forward` does it) -> keep mask (`KeepMask`) -> `attend(q, k, v, keep, ctx)` (the paper's math) -> merge
heads -> `project_out` (``out_proj(post_merge(o))``). What a variant needs beyond q, k, v and keep comes in a typed
`AttentionContext`: the layer's input states, the query offset during cached decoding, the cache (where decoding
state lives: `HfAttnCache`) and the forward pass's `ForwardState` (auxiliary losses, values to log, statistics for
model-level objectives, and the internal maps a caller asked for). Model-level hooks (`attach`, `model_losses`,
`max_positions`, `set_training_step`, `freeze_fixed_weights`) are declared here with no-op defaults.

The model runs under its own attention implementation name, ``"hf_attn"``, registered here with a mask function
that returns a `KeepMask` (True = may attend): key padding ``[B, S]`` + a causal flag + the query offset, not a dense
``[B, 1, T, S]`` tensor (transformers would otherwise hand a custom implementation no mask at all, and SDPA's mask is
None when nothing is padded). Every variant's ``attend`` reads it through its small API (`KeepMask.sdpa_mask`,
`fill_hidden`, `zero_hidden`, `block`, `real_keys`, `visible_keys`, `dense`); what it builds (the dense bool
``[B|1, 1, T, S]`` mask, the fill mask, the SDPA mask) is built once per stack and shared by its layers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer, EncoderDecoderCache
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
    sdpa_mask,
)
from transformers.models.bart.modeling_bart import BartAttention

ATTN_IMPLEMENTATION = "hf_attn"
SITES = ("encoder", "decoder", "cross")
# the name under which transformers hands the K/V cache to every forward: ``cache`` since 5.24, ``past_key_values``
# before (the layers pass it by keyword; the modules and the model accept both)
CACHE_KWARG = "cache" if "cache" in inspect.signature(BartAttention.forward).parameters else "past_key_values"


def pop_cache(cache, kwargs: dict):
    """The cache a forward was given, under either name (``cache``, or ``past_key_values`` before 5.24)."""
    legacy = kwargs.pop("past_key_values", None)
    return legacy if cache is None else cache


class HfAttnConfigError(ValueError):
    """Bad hf-attn configuration: the message names the value, the valid choices and the fix."""


@dataclass(frozen=True)
class Preset:
    """A named configuration: config overrides (variant per site, layer subsets, hyperparameters) + provenance."""

    name: str
    description: str
    paper: str
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Hyperparameter:
    """One variant hyperparameter: a flat config field with a type, the default, its valid values and a help line.

    ``type`` is int, float, bool, str (with ``choices``), ``list[int]`` or ``list[float]`` (non-empty lists; the
    range applies to each element). ``low``/``high`` bound numbers (``*_open``: the bound itself is excluded);
    floats must be finite. ``nullable``: None is valid too (its meaning is in ``help``). ``help`` is one line and
    cites the paper (or the code) the default comes from.
    """

    name: str
    type: object
    default: object
    help: str
    choices: tuple | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False

    def __post_init__(self):
        if isinstance(self.default, list):  # stored as a tuple: the declaration is frozen and hashable
            object.__setattr__(self, "default", tuple(self.default))
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))

    @property
    def element_type(self) -> type:
        """int / float for ``list[int]`` / ``list[float]``, else ``type`` itself."""
        return getattr(self.type, "__args__", (self.type,))[0]

    @property
    def is_list(self) -> bool:
        return getattr(self.type, "__origin__", None) is list

    def initial(self):
        """The default as a config value (a fresh list for list types)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def normalise(self, value):
        """A valid ``value`` in the declared type (2.0 -> 2 for int, 1 -> 1.0 for float, tuple -> list: e.g. values
        read back from JSON); an invalid one is returned unchanged, for `check` to name it as given."""
        if value is None or not self._valid(value):
            return value
        if self.is_list:
            return [_as_number(x, self.element_type) for x in value]
        return _as_number(value, self.type) if self.type in (int, float) else value

    def check(self, value) -> None:
        """Raise `HfAttnConfigError` (one line: field, value, what is valid, the default and its source)."""
        if not (value is None and self.nullable) and not self._valid(value):
            raise HfAttnConfigError(
                f"{self.name}={value!r} {self.requirement()} (default {self.initial()!r}: {self.help})"
            )

    def _valid(self, value) -> bool:
        if self.choices is not None:
            return isinstance(value, self.type) and value in self.choices
        if self.type is bool:
            return isinstance(value, bool)
        if self.is_list:
            return isinstance(value, (list, tuple)) and len(value) > 0 and all(self._valid_number(x) for x in value)
        return self._valid_number(value)

    def _valid_number(self, x) -> bool:
        kind = self.element_type
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        if kind is int and not (isinstance(x, int) or (math.isfinite(x) and x == int(x))):
            return False
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return self.high is None or (x < self.high if self.high_open else x <= self.high)

    def valid_values(self) -> str:
        """What is valid, e.g. ``an integer >= 1``, ``in (0, 0.01]``, ``one of ['gate', 'dot']``."""
        if self.choices is not None:
            text = f"one of {list(self.choices)}"
        elif self.type is bool:
            text = "true or false"
        else:
            noun = "an integer" if self.element_type is int else "a finite number"
            if self.low is not None and self.high is not None:
                lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
                bound = f"in {lo}{self.low:g}, {self.high:g}{hi}"
                text = bound if self.element_type is float else f"{noun} {bound}"
            elif self.low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
            elif self.high is not None:
                text = f"{noun} {'<' if self.high_open else '<='} {self.high:g}"
            else:
                text = noun
            if self.is_list:
                plural = text.replace("an integer", "integers").replace("a finite number", "finite numbers")
                text = f"a non-empty list of {plural if plural != text else 'numbers ' + text}"
        return f"{text} or None" if self.nullable else text

    def requirement(self) -> str:
        if self.choices is not None:
            return f"is not valid; choose one of {list(self.choices)}" + (" or None" if self.nullable else "")
        return f"must be {self.valid_values()}"

    def type_name(self) -> str:
        name = f"list[{self.element_type.__name__}]" if self.is_list else self.type.__name__
        return f"{name} | None" if self.nullable else name


def _as_number(value, kind: type):
    """``value`` as ``kind`` (int / float) when that is exact, else unchanged."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if kind is float:
        return float(value)
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def all_sites(variant: str, **extra) -> dict:
    """Preset overrides putting ``variant`` at every attention site."""
    return {"encoder_attention": variant, "decoder_attention": variant, "cross_attention": variant, **extra}


# --------------------------------------------------------------------------------------------------------------
# The "hf_attn" attention implementation: a compact keep mask always, and softmax attention for untouched modules.
# --------------------------------------------------------------------------------------------------------------
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


def keep_mask_interface(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                        attention_mask=None, local_size=None, **kwargs) -> KeepMask:
    """Mask function for ``_attn_implementation="hf_attn"``: a compact `KeepMask` from the 2-D padding mask and
    causality; other patterns (custom mask functions) are materialised by transformers' `sdpa_mask`, held dense."""
    if mask_function in (causal_mask_function, bidirectional_mask_function) and kv_offset == 0 and local_size is None:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is not None:
            padding = padding.bool()
            if not torch.compiler.is_compiling():  # (a host check: a compiled graph keeps the mask, same result)
                padding = None if padding.all() else padding
        device = kwargs.get("device")
        return KeepMask(q_length, kv_length, padding, mask_function is causal_mask_function, q_offset,
                        home=torch.device(device) if device is not None else None)
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    kwargs.pop("dtype", None)
    kwargs.pop("config", None)
    dense = sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                      local_size, **kwargs)
    return KeepMask.from_dense(dense)


def nonempty(keep: torch.Tensor) -> torch.Tensor:
    """Let rows with no visible key see every key (their output is discarded anyway: a fully padded sequence).

    Avoids the NaN that softmax/SDPA give, and the crash entmax gives, on an all-masked row.
    """
    return keep | ~keep.any(dim=-1, keepdim=True)


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


AttentionInterface.register(ATTN_IMPLEMENTATION, hf_attn_attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, keep_mask_interface)


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


# --------------------------------------------------------------------------------------------------------------
# Per-forward outputs and decoding state
# --------------------------------------------------------------------------------------------------------------
FORWARD_STATE_KWARG = "hf_attn_state"  # the keyword under which the model hands its ForwardState to every layer


class ForwardState:
    """The extra outputs of one model forward pass, filled by the attention modules.

    The model creates one per call and passes it as ``hf_attn_state=...`` (transformers forwards keyword arguments
    through the stacks and layers to every attention module); the model-level hooks read it afterwards and the
    results become fields of `HfAttnSeq2SeqLMOutput`. Nothing outlives the call. Modules run outside the model's
    forward (e.g. the encoder inside ``generate``) get none.

    A plain class, not a dataclass or a dict: FSDP rebuilds the dataclasses and dicts among a layer's arguments
    that hold tensors needing gradients, so the layers after the first would write to copies the model never sees.
    """

    def __init__(self, details: dict | None = None, mode: str = "default") -> None:
        self.losses: dict = {}  # name -> [weighted loss tensors]
        self.logs: dict = {}  # name -> [scalar tensors], averaged into ``aux_logs``
        self.layer_stats: dict = {}  # (variant, site, layer) -> statistics for `model_losses`
        self.details = details  # "site.layer" -> {name: tensor}: the variants' internal maps, when asked for
        self.shared: dict = {}  # values computed once per pass and read by several layers (RAN)
        self.mode = mode  # "perturbed": attention calibration's perturbed decoder pass
        self.frozen: dict = {}  # id(layer) -> parameters a hook froze for one layer call

    def log(self, name: str, value: torch.Tensor) -> None:
        self.logs.setdefault(name, []).append(value.detach().float())

    def record(self, site: str, layer: int, maps: dict) -> None:
        """Keep ``maps`` (detached) under ``"site.layer"`` when the caller asked for the variants' details."""
        if self.details is not None:
            entry = self.details.setdefault(f"{site}.{layer}", {})
            entry.update({k: v.detach() for k, v in maps.items() if v is not None})


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


@dataclass
class AttentionContext:
    """What `VariantAttention.attend` may read besides q, k, v and keep, built once per call by `forward`."""

    hidden_states: torch.Tensor  # x, the layer's input [B, T, d]
    key_value_states: torch.Tensor | None  # cross-attention: the encoder states [B, S, d]; else None
    past: int  # target positions before this call during cached decoding (the query offset); 0 otherwise
    cache: HfAttnCache | None  # decoding state (`get_state` / `set_state`); None without a cache
    output_attentions: bool
    state: ForwardState | None  # the forward pass's extra outputs; None outside the model's forward

    @property
    def cached(self) -> bool:
        return self.cache is not None


# BartAttention.forward's K/V-cache logic (transformers 5.23, models/bart/modeling_bart.py; Marian's is the same),
# in one place. `keys=False`: no key projection, for the position-only variants. tests/test_core.py checks that
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


# --------------------------------------------------------------------------------------------------------------
# The variant mixin
# --------------------------------------------------------------------------------------------------------------
class VariantAttention:
    """Mixin for one attention variant. Subclasses set `variant`, `sites`, `hyperparameters`, `presets` and implement
    `attend`; every other hook has a no-op default.

    Life cycle: ``__init__`` (base projections) -> `setup` (variant parameters) ; `init_variant_weights` is called by
    the model's ``initialize_weights`` (with `transformers.initialization` helpers, which skip loaded tensors).
    """

    variant: str = ""
    description: str = ""
    sites: tuple[str, ...] = SITES
    # variant hyperparameters (type, paper default, valid values, help); they become flat config fields, checked
    # by the config (`Hyperparameter.check`); docs/papers/ lists them per paper
    hyperparameters: tuple[Hyperparameter, ...] = ()
    # the paper's method, baselines and ablations as named presets (collected into hf_attn.PRESETS)
    presets: tuple[Preset, ...] = ()
    # False: the weights depend on positions only; no q/k projections, zeros for keys in the cache (`project`)
    uses_keys: bool = True

    def __init__(self, *args, site: str = "encoder", **kwargs):
        super().__init__(*args, **kwargs)
        self.site = site
        if not self.uses_keys:  # no unused parameters: the weights never look at the tokens
            del self.q_proj
            del self.k_proj
        self.setup(self.config)

    # ---- module hooks ----------------------------------------------------------------------------------------
    @classmethod
    def validate_config(cls, config) -> None:
        """Cross-field rules only (each field's type and range come from `hyperparameters`); must not change config.

        Raise `HfAttnConfigError` (one line) for an invalid combination.
        """

    @classmethod
    def layer_subset(cls, config, site: str) -> list[int] | None:
        """The layers of ``site`` this variant restricts itself to when it is the site's single variant and
        ``<site>_attention_layers`` is unset (GMM's ``gmm_layer_subset``); None = every layer."""
        return None

    def setup(self, config) -> None:
        """Create the variant's own parameters."""

    def init_variant_weights(self, init) -> None:
        """Initialise the variant's own parameters; `init` is `transformers.initialization`."""

    def attend(self, q, k, v, keep, ctx: AttentionContext):
        """The variant's math. q ``[B,H,T,dh]`` (unscaled; None when not `uses_keys`), k ``[B,H,S,dh]`` (or None),
        v ``[B,H,S,dh]``, keep the `KeepMask` (``keep.dense()``: the bool ``[B|1,1|H,T,S]``). Returns (context ``[B,H,T,dh]``, weights ``[B,H,T,S]`` or
        None: the weights only when ``ctx.output_attentions``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend(q, k, v, keep, ctx)")

    def post_merge(self, o: torch.Tensor) -> torch.Tensor:
        """Transform the merged heads ``[B,T,d]`` before ``out_proj`` (ReLA's normalisation)."""
        return o

    def project_out(self, o: torch.Tensor) -> torch.Tensor:
        """The layer's output from the merged heads ``[B,T,d]``: ``out_proj(post_merge(o))``. A variant overrides it
        to fuse the two in training (ReLA: autograd then keeps o alone, not the normalised output too)."""
        return self.out_proj(self.post_merge(o))

    def set_training_step(self, step: int) -> None:
        """Optimiser-step-driven schedules (attention calibration's annealing); called through the model."""

    def freeze_fixed_weights(self) -> None:
        """Re-freeze fixed tensors after loading (transformers' loader makes every loaded tensor trainable)."""

    # ---- model-level hooks -------------------------------------------------------------------------------------
    @classmethod
    def attach(cls, model) -> None:
        """Once after the modules are swapped in: stack-level parameters (RAN's A0), with one owner each."""

    @classmethod
    def model_losses(cls, model, outputs, inputs: dict, state: ForwardState) -> tuple[dict, dict]:
        """({name: weighted loss}, {name: value to log}) at the model level, after the forward pass (attention
        calibration's perturbed pass, ReLUFormer's regulariser); ``state`` holds what the layers left there."""
        return {}, {}

    @classmethod
    def training_objective(cls, config) -> bool:
        """True when training this variant adds an auxiliary objective to the loss (it then needs ``labels``)."""
        return False

    @classmethod
    def needs_training_step(cls, config) -> bool:
        """True when a schedule follows the optimiser step (`set_training_step` must be called while training)."""
        return False

    @classmethod
    def max_positions(cls, config) -> int | None:
        """A hard length limit of the variant (RAN's Lmax), or None; generation is capped to it."""
        return None

    # ---- the one forward path ----------------------------------------------------------------------------------
    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.training else 0.0

    def project(self, hidden_states, key_value_states=None, past_key_values=None):
        """(q or None, k or None, v), with the K/V cache (`project_with_cache`)."""
        k, v = project_with_cache(self, hidden_states, key_value_states, past_key_values, keys=self.uses_keys)
        if not self.uses_keys:
            return None, None, v
        q = self.q_proj(hidden_states).view(*hidden_states.shape[:-1], -1, self.head_dim).transpose(1, 2)
        return q, k, v

    def keep_mask(self, attention_mask, q_len, k_len):
        """The `KeepMask` of this call (shared by the layers of a stack, with what it builds once)."""
        return keep_from_mask(attention_mask, q_len, k_len, self.is_causal and self.site == "decoder",
                              device=self.out_proj.weight.device)

    def forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
        past_key_values = pop_cache(cache, kwargs)
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values = HfAttnCache.wrap(past_key_values)
        tgt_len = hidden_states.shape[1]
        past = query_offset(past_key_values, key_value_states is not None, self.layer_idx, tgt_len)
        q, k, v = self.project(hidden_states, key_value_states, past_key_values)
        keep = self.keep_mask(attention_mask, tgt_len, v.shape[2])
        output_attentions = kwargs.get("output_attentions")
        ctx = AttentionContext(
            hidden_states=hidden_states,
            key_value_states=key_value_states,
            past=past,
            cache=past_key_values if isinstance(past_key_values, HfAttnCache) else None,
            output_attentions=bool(self.config.output_attentions if output_attentions is None else output_attentions),
            state=kwargs.get(FORWARD_STATE_KWARG),
        )
        out, weights = self.attend(q, k, v, keep, ctx)
        o = out.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.project_out(o), weights

    def extra_repr(self) -> str:
        return f"variant={self.variant}, site={self.site}, layer={self.layer_idx}"


@functools.cache
def attention_class(base: type, mixin: type) -> type:
    """The concrete module class ``mixin + base`` (e.g. ``MarianRelaAttention``), created once and cached."""
    name = base.__name__.replace("Attention", "") + mixin.__name__
    return type(name, (mixin, base), {"__module__": mixin.__module__})


_NO_CONTEXT = contextlib.nullcontext()


def float32_autocast_off(tensor: torch.Tensor):
    """Context to run custom normalisations in float32 even under fp16/bf16 autocast; a shared no-op context when
    autocast is off for the tensor's device (entering ``torch.autocast`` costs more than a small decoding op)."""
    if not torch.is_autocast_enabled(tensor.device.type):
        return _NO_CONTEXT
    return torch.autocast(device_type=tensor.device.type, enabled=False)
