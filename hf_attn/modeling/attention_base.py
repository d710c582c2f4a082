"""Shared machinery of every hf-attn attention variant.

A variant is a *mixin* holding the paper's math; `attention_class(base, mixin)` combines it with the base model's
own attention class (`MarianAttention` or `BartAttention`), so that the q/k/v/out parameter names stay those of a
vanilla checkpoint and transformers' `output_attentions` recorders (which match `isinstance(m, MarianAttention)`)
keep working.

The model runs under its own attention implementation name, ``"hf_attn"``, registered here with a mask function
that always materialises a boolean ``keep`` mask ``[B, 1, T, S]`` (True = may attend), built from padding and,
for decoder self-attention, causality (HF_NOTES traps 1-2).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import EncoderDecoderCache
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "hf_attn"
SITES = ("encoder", "decoder", "cross")


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
# The "hf_attn" attention implementation: a boolean mask always, and softmax attention for untouched modules.
# --------------------------------------------------------------------------------------------------------------
def keep_mask_interface(*args, **kwargs):
    """Mask function for ``_attn_implementation="hf_attn"``: never skips, always a bool ``[B,1,T,S]`` mask."""
    kwargs["allow_is_causal_skip"] = False
    kwargs["allow_is_bidirectional_skip"] = False
    kwargs.pop("dtype", None)
    kwargs.pop("config", None)
    return sdpa_mask(*args, **kwargs)


def nonempty(keep: torch.Tensor) -> torch.Tensor:
    """Let rows with no visible key see every key (their output is discarded anyway: a fully padded sequence).

    Avoids the NaN that softmax/SDPA give, and the crash entmax gives, on an all-masked row.
    """
    return keep | ~keep.any(dim=-1, keepdim=True)


def softmax_attention(q, k, v, keep, scaling, dropout, need_weights):
    """Standard softmax attention, Vaswani et al. 2017 Eq. 1: softmax(q k^T / sqrt(dh)) V.

    Uses SDPA unless the weights are requested (then the eager path, with identical math).
    """
    keep = nonempty(keep)
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=dropout, scale=scaling), None
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    ctx = torch.matmul(F.dropout(weights, p=dropout, training=dropout > 0), v)
    return ctx, weights


def hf_attn_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """`AttentionInterface` entry for modules that kept the stock attention class (returns ``[B,T,H,dh]``)."""
    keep = keep_from_mask(
        attention_mask, query.shape[2], key.shape[2], query.device, getattr(module, "is_causal", False)
    )
    ctx, weights = softmax_attention(
        query, key, value, keep, scaling or query.shape[-1] ** -0.5, dropout, bool(kwargs.get("output_attentions"))
    )
    return ctx.transpose(1, 2).contiguous(), weights


AttentionInterface.register(ATTN_IMPLEMENTATION, hf_attn_attention_forward)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, keep_mask_interface)


def keep_from_mask(attention_mask, q_len: int, k_len: int, device, is_causal: bool) -> torch.Tensor:
    """Turn whatever mask transformers hands a layer into a boolean keep mask ``[B|1, 1, T, S]``.

    bool masks (our implementation) pass through; additive float masks (eager) become ``mask > min/2``; ``None``
    (sdpa without padding) becomes all-True, or causal with the cache offset ``S - T`` for causal self-attention.
    """
    if attention_mask is None:
        if not is_causal:
            return torch.ones(1, 1, q_len, k_len, dtype=torch.bool, device=device)
        rows = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
        return (torch.arange(k_len, device=device)[None, :] <= rows)[None, None]
    if attention_mask.dtype != torch.bool:
        attention_mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    return attention_mask[..., -k_len:]


def source_padding(keep: torch.Tensor) -> torch.Tensor:
    """Key-padding mask ``[B, 1, 1, S]`` (True = real token) from a cross-attention keep mask."""
    return keep.any(dim=-2, keepdim=True)


# --------------------------------------------------------------------------------------------------------------
# The variant mixin
# --------------------------------------------------------------------------------------------------------------
class VariantAttention:
    """Mixin for one attention variant. Subclasses set `variant`, `sites`, `hyperparameters` and override `attend`.

    Life cycle: ``__init__`` (base projections) -> `setup` (variant parameters) ; `init_variant_weights` is called by
    the model's ``initialize_weights`` (with `transformers.initialization` helpers, which skip loaded tensors).
    """

    variant: str = ""
    description: str = ""
    sites: tuple[str, ...] = SITES
    # variant hyperparameters (type, paper default, valid values, help); they become flat config fields, checked
    # by the config (`Hyperparameter.check`), set by `hf-attn train` flags and listed by `hf-attn presets --verbose`
    hyperparameters: tuple[Hyperparameter, ...] = ()
    # the paper's method, baselines and ablations as named presets (collected into hf_attn.PRESETS)
    presets: tuple[Preset, ...] = ()

    def __init__(self, *args, site: str = "encoder", **kwargs):
        super().__init__(*args, **kwargs)
        self.site = site
        self.setup(self.config)

    # ---- hooks for subclasses -----------------------------------------------------------------------------
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

    def attend(self, q, k, v, keep, output_attentions=False):
        """Variant math. q ``[B,H,T,dh]`` (unscaled), k/v ``[B,H,S,dh]``, keep bool ``[B|1,1|H,T,S]``.

        Returns (context ``[B,H,T,dh]``, weights ``[B,H,T,S]`` or None).
        """
        raise NotImplementedError

    def post_merge(self, o: torch.Tensor) -> torch.Tensor:
        """Transform the merged heads ``[B,T,d]`` before ``out_proj`` (ReLA's normalisation)."""
        return o

    # ---- shared steps ---------------------------------------------------------------------------------------
    @property
    def attn_dropout(self) -> float:
        return self.dropout if self.training else 0.0

    def project(self, hidden_states, key_value_states=None, past_key_values=None):
        """q/k/v projections with the K/V cache, exactly as `MarianAttention.forward` does them."""
        is_cross = key_value_states is not None
        bsz, tgt_len = hidden_states.shape[:2]
        q = self.q_proj(hidden_states).view(bsz, tgt_len, -1, self.head_dim).transpose(1, 2)
        cache, is_updated = None, False
        if past_key_values is not None:
            if isinstance(past_key_values, EncoderDecoderCache):
                is_updated = past_key_values.is_updated.get(self.layer_idx)
                cache = past_key_values.cross_attention_cache if is_cross else past_key_values.self_attention_cache
            else:
                cache = past_key_values
        current = key_value_states if is_cross else hidden_states
        if is_cross and cache is not None and is_updated:
            k, v = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
        else:
            shape = (*current.shape[:-1], -1, self.head_dim)
            k = self.k_proj(current).view(shape).transpose(1, 2)
            v = self.v_proj(current).view(shape).transpose(1, 2)
            if cache is not None:
                k, v = cache.update(k, v, self.layer_idx)
                if is_cross and isinstance(past_key_values, EncoderDecoderCache):
                    past_key_values.is_updated[self.layer_idx] = True
        return q, k, v

    def keep_mask(self, attention_mask, q_len, k_len, device):
        return keep_from_mask(attention_mask, q_len, k_len, device, self.is_causal and self.site == "decoder")

    def forward(self, hidden_states, key_value_states=None, past_key_values=None, attention_mask=None, **kwargs):
        q, k, v = self.project(hidden_states, key_value_states, past_key_values)
        keep = self.keep_mask(attention_mask, q.shape[2], k.shape[2], q.device)
        ctx, weights = self.attend(q, k, v, keep, output_attentions=bool(kwargs.get("output_attentions")))
        o = ctx.transpose(1, 2).reshape(*hidden_states.shape[:-1], -1)
        return self.out_proj(self.post_merge(o)), weights

    def extra_repr(self) -> str:
        return f"variant={self.variant}, site={self.site}, layer={self.layer_idx}"


@functools.cache
def attention_class(base: type, mixin: type) -> type:
    """The concrete module class ``mixin + base`` (e.g. ``MarianRelaAttention``), created once and cached."""
    name = base.__name__.replace("Attention", "") + mixin.__name__
    return type(name, (mixin, base), {"__module__": mixin.__module__})


def float32_autocast_off(tensor: torch.Tensor):
    """Context to run custom normalisations in float32 even under fp16/bf16 autocast."""
    return torch.autocast(device_type=tensor.device.type, enabled=False)
