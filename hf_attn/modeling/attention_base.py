"""The attention contract every hf-attn variant follows.

A variant is a *mixin* holding the paper's math; `attention_class(base, mixin)` combines it with the base model's
own attention class (`MarianAttention` or `BartAttention`), so that the q/k/v/out parameter names stay those of a
vanilla checkpoint and transformers' `output_attentions` recorders (which match `isinstance(m, MarianAttention)`)
keep working.

One forward path for every variant (`VariantAttention.forward`): `project` (q/k/v and the K/V cache, as
`BartAttention.forward` does it: `cache.project_with_cache`) -> keep mask (`masking.KeepMask`) -> `attend(q, k, v,
keep, ctx)` (the paper's math) -> merge heads -> `project_out` (``out_proj(o)``). What a variant needs beyond q, k, v
and keep comes in a typed `forward_state.AttentionContext`: the layer's input states, the query offset during cached
decoding, the cache (where decoding state lives: `cache.HfAttnCache`) and the forward pass's
`forward_state.ForwardState` (auxiliary losses, values to log, statistics for model-level objectives, and the internal
maps a caller asked for). Model-level hooks (`attach`, `model_losses`, `max_positions`, `set_training_step`,
`freeze_fixed_weights`) are declared here with no-op defaults.

The sibling modules, each one thing (flat: they ship to the Hub with a model): `hyperparameters` (sites, `Preset`,
`Hyperparameter`), `masking` (`KeepMask` and the mask function), `cache`, `forward_state`, `kernels` (softmax
attention, the shared ``dropout(weights) V`` step and the ``"hf_attn"`` implementation's `register`).
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import EncoderDecoderCache

from .cache import HfAttnCache, pop_cache, project_with_cache, query_offset
from .forward_state import FORWARD_STATE_KWARG, AttentionContext, ForwardState
from .hyperparameters import SITES, Hyperparameter, Preset
from .masking import keep_from_mask


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

    def project_out(self, o: torch.Tensor) -> torch.Tensor:
        """The layer's output from the merged heads ``[B,T,d]``: ``out_proj(o)``. A variant overrides it to transform
        o first (ReLA's normalisation, fused with ``out_proj`` in training)."""
        return self.out_proj(o)

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
