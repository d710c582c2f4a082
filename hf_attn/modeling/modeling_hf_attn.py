"""Marian and BART encoder-decoders whose attention layers are swapped for hf-attn variants.

Each model subclasses the stock transformers class, forces the ``"hf_attn"`` attention implementation (so every
layer receives a boolean keep mask), then replaces ``layer.self_attn`` / ``layer.encoder_attn`` per the config
with ``attention_class(MarianAttention | BartAttention, variant)``. The q/k/v/out parameter names are unchanged,
so a vanilla checkpoint warm-starts every shared weight.

Every forward pass hands the layers one `ForwardState` (keyword ``hf_attn_state``) and wraps the cache in an
`HfAttnCache`; afterwards each variant's `model_losses` hook turns what the layers left there into the output's
``aux_loss`` / ``aux_logs``, and ``output_attention_details=True`` returns the variants' internal maps.

``attn_implementation`` requests (the config path and `set_attn_implementation` alike) are checked by
`check_attn_implementation`: ``"eager"`` (what users and transformers' tests set to get attention weights) is
accepted for every variant, ``"sdpa"`` where every site is softmax; whatever is accepted, every site keeps running
hf-attn's own implementation, so the outputs never depend on the request. ``"eager"`` also keeps every module off the
fused Triton kernels (``eager_attention``, see `fused.dispatch`), as does a forward pass that asks for attention
weights or details.
"""

from __future__ import annotations

from dataclasses import dataclass

# first: on a transformers below the floor, one error line before anything else is imported
from .compat import TRANSFORMERS_VERSION

import torch
from transformers import BartForConditionalGeneration, GenerationMixin, MarianMTModel, initialization as init
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.models.bart.modeling_bart import BartAttention
from transformers.models.marian.modeling_marian import MarianAttention

from .attention_base import VariantAttention, attention_class
from .cache import CACHE_KWARG, HfAttnCache, pop_cache
from .configuration_hf_attn import HfAttnBartConfig, HfAttnMarianConfig
from .forward_state import FORWARD_STATE_KWARG, ForwardState
from .fused import set_eager_attention
from .hyperparameters import SITES, HfAttnConfigError
from .kernels import ATTN_IMPLEMENTATION, register
from .masking import is_prepared_keep_mask
from .registry import ATTENTION_VARIANTS

# every file of the model code that the imports above reach, imported directly: see configuration_hf_attn
from .attention_blockwise import BlockOptions  # noqa: F401
from .attention_calibration import CalibratedAttention  # noqa: F401
from .attention_fixed import HardGaussianAttention  # noqa: F401
from .attention_gmm import GmmFFN  # noqa: F401
from .attention_positional import PositionalAttention  # noqa: F401
from .attention_ran import RanStack  # noqa: F401
from .attention_rela import RelaAttention  # noqa: F401
from .attention_reluformer import reluformer_attention  # noqa: F401
from .attention_softmax import SoftmaxAttention  # noqa: F401
from .citations import Citation  # noqa: F401
from .gmm_mixture import MixtureDensity  # noqa: F401
from .presets import PRESETS  # noqa: F401
from .triton_calibration import MODES  # noqa: F401
from .triton_relu import triton_supports  # noqa: F401


@dataclass
class HfAttnSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus the variants' auxiliary loss (already weighted; included in ``loss`` when labels
    are given), scalars to log (``aux_logs``) and, with ``output_attention_details=True``, the variants' internal
    maps per layer (``attention_details``: ``{"cross.2": {"alpha": ..., "beta": ..., "gate": ...}, ...}``).

    Like transformers' optional outputs, a field that was not computed is None and left out of ``to_tuple()`` (and
    so of the ``return_dict=False`` tuple). ``aux_loss`` / ``aux_logs`` are computed by a forward pass that can be
    trained or scored (training mode, ``labels`` given, or autograd recording), never by a pure inference call
    (eval mode, no labels, under ``torch.no_grad``: what ``generate`` and transformers' inference checks run),
    whose output therefore has exactly stock's fields. When present they come after all of stock's fields, in this
    order: ``aux_loss``, ``aux_logs``, ``attention_details``.
    """

    aux_loss: torch.FloatTensor | None = None
    aux_logs: dict | None = None
    attention_details: dict | None = None


# Variants whose own attention is torch's SDPA kernel: `SoftmaxAttention.attend` calls
# `F.scaled_dot_product_attention` (the eager math only when weights are requested). No variant has a
# flash-attention or flex-attention kernel.
SDPA_VARIANTS = frozenset({"softmax"})
EAGER = "eager"
SDPA = "sdpa"


def check_attn_implementation(requested, variants) -> None:
    """Accept an ``attn_implementation`` request that hf-attn's own implementation honours; one clear error for
    any other. ``variants``: the variant names the model uses (at any site).

    Whatever is accepted, every site keeps running through hf-attn's own implementation (the ``"hf_attn"``
    `AttentionInterface` entry): a request never switches a layer to transformers' stock attention code, which
    would ignore the variants. What each request means here:

    * None / ``"hf_attn"``: nothing to honour.
    * ``"eager"``: each variant's own implementation, which returns its attention weights with
      ``output_attentions=True`` (the reason users and transformers' tests ask for "eager"). Every variant.
    * ``"sdpa"``: only where every site is softmax, whose attention already runs torch's SDPA kernel.
    * anything else (``"flash_attention_2"`` / ``_3``, ``"flex_attention"``, ``"paged|..."``, Hub kernels): no
      variant has such a kernel.
    """
    if requested in (None, ATTN_IMPLEMENTATION, EAGER):
        return
    if requested == SDPA:
        without = sorted(set(variants) - SDPA_VARIANTS)
        if without:
            raise HfAttnConfigError(
                f"attn_implementation='sdpa' is not available for this model: its {without} attention has no SDPA "
                "kernel (only 'softmax' sites run torch's scaled_dot_product_attention); use "
                "attn_implementation='eager' (each variant's own attention, which returns attention weights) or "
                "leave it unset"
            )
        return
    raise HfAttnConfigError(
        f"attn_implementation={requested!r} is not available for hf-attn models: no attention variant has that "
        "kernel (every site runs hf-attn's own implementation; softmax sites use torch's "
        "scaled_dot_product_attention); use attn_implementation='eager' (each variant's own attention, which "
        "returns attention weights), 'sdpa' (models whose every site is softmax) or leave it unset"
    )


class HfAttnModelMixin:
    """Shared by `HfAttnMarianMTModel` and `HfAttnBartForConditionalGeneration`."""

    base_attention_class: type = MarianAttention
    accepts_loss_kwargs = False  # the loss is a mean over tokens: a training loop must not re-normalise it
    # every site runs through hf-attn's own implementation (softmax sites call torch's SDPA kernel, or its eager
    # equivalent when weights are requested): transformers' implementations are never switched to. "eager" and, for
    # an all-softmax model, "sdpa" are accepted as requests (`check_attn_implementation`); the class flags stay
    # False because they are per class while what can be honoured depends on the config's variants
    _supports_sdpa = False
    _supports_flash_attn = False
    _supports_flex_attn = False
    # torch.compile works with graph breaks for every preset (scripts/check_compile.py); one full graph is not
    # promised: RAN and the Synthesizer check the padding on the host, entmax's autograd functions do not inline,
    # attention calibration's training step toggles requires_grad
    _can_compile_fullgraph = False

    def __init__(self, config):
        # the config path: from_pretrained(..., attn_implementation=), from_config(...), config._attn_implementation
        requested = config._attn_implementation
        check_attn_implementation(requested, {v for layout in config.attention_layout().values() for v in layout})
        register()
        config._attn_implementation = ATTN_IMPLEMENTATION  # not saved in config.json: forced on every load
        super().__init__(config)
        self.config._attn_implementation = ATTN_IMPLEMENTATION
        # what was asked for, reported only: the layers run hf-attn's own implementation whatever it is
        self.requested_attn_implementation = requested
        self._step_driven = False  # set_training_step has been called (schedules follow training)
        self._swap_attention_modules()
        self._apply_eager_request()
        self.post_init()

    # ---- construction ---------------------------------------------------------------------------------------
    def _attention_slots(self):
        """(site, layer index, parent layer, attribute) for every attention module."""
        for i, layer in enumerate(self.model.encoder.layers):
            yield "encoder", i, layer, "self_attn"
        for i, layer in enumerate(self.model.decoder.layers):
            yield "decoder", i, layer, "self_attn"
            yield "cross", i, layer, "encoder_attn"

    def _swap_attention_modules(self):
        for site, i, layer, attr in self._attention_slots():
            old = getattr(layer, attr)
            cls = attention_class(self.base_attention_class, ATTENTION_VARIANTS[self.config.attention_variant(site, i)])
            new = cls(
                embed_dim=old.embed_dim,
                num_heads=old.num_heads,
                dropout=old.dropout,
                is_decoder=old.is_decoder,
                bias=old.k_proj.bias is not None,
                is_causal=old.is_causal,
                config=self.config,
                layer_idx=i,  # Marian's encoder passes None: indices are set here for every site
                site=site,
            )
            setattr(layer, attr, new)
        used = {v for layout in self.config.attention_layout().values() for v in layout}
        # the layout the modules were built from, read once: every forward pass asks (config reads are slow)
        self._variant_classes = [cls for name, cls in ATTENTION_VARIANTS.items() if name in used]
        for cls in self.variant_classes():
            cls.attach(self)

    def variant_classes(self) -> list[type]:
        """The variant mixins used by this model, in registry order."""
        return list(self._variant_classes)

    def attention_modules(self, site: str | None = None) -> list[VariantAttention]:
        """Every attention module (optionally of one site: 'encoder', 'decoder', 'cross'), in layer order."""
        if site is not None and site not in SITES:
            raise HfAttnConfigError(f"site={site!r} is not valid; choose one of {list(SITES)}")
        return [getattr(layer, attr) for s, _, layer, attr in self._attention_slots() if site in (None, s)]

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """False: transformers' switching (the layers calling another `AttentionInterface` entry, which
        ``config._attn_implementation`` then names) never happens here; transformers' common tests skip it."""
        return False

    def set_attn_implementation(self, attn_implementation, *args, **kwargs) -> None:
        """Accept what `check_attn_implementation` accepts (``"eager"``; ``"sdpa"`` for an all-softmax model),
        exactly as the config path does, and remember it in ``requested_attn_implementation``; the layers keep
        running hf-attn's own implementation and ``config._attn_implementation`` stays ``"hf_attn"``."""
        if isinstance(attn_implementation, dict):
            attn_implementation = attn_implementation.get("", ATTN_IMPLEMENTATION)
        check_attn_implementation(attn_implementation, [cls.variant for cls in self.variant_classes()])
        self.requested_attn_implementation = attn_implementation
        self._apply_eager_request()

    def _apply_eager_request(self) -> None:
        """``eager_attention`` on every attention module: True when ``attn_implementation="eager"`` was requested
        (the eager torch path, never the fused kernels), else False (`fused.dispatch` decides)."""
        set_eager_attention(self.attention_modules(), self.requested_attn_implementation == EAGER)

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, then `freeze_fixed_weights` (loading replaces frozen tensors)."""
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        if TRANSFORMERS_VERSION[:2] == (5, 3):
            # transformers 5.3 leaves the tied embeddings of a model with an auto class (remote code, and hf_attn's
            # registered classes) untied, on the meta device: `mark_tied_weights_as_initialized` takes them off the
            # missing keys, so `tie_weights` finds "both present" and skips them (modeling_utils; 5.4 ties them)
            model.tie_weights()
            model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=False)
        model.freeze_fixed_weights()
        return loaded

    def freeze_fixed_weights(self) -> None:
        """Keep fixed tensors fixed after loading: transformers 5.23's loader swaps in fresh trainable Parameters,
        so Marian's sinusoidal position table (and a variant's frozen tensors, via the module hook
        ``freeze_fixed_weights``) would silently start learning when a saved model is fine-tuned or resumed."""
        for module in self.modules():
            if type(module).__name__.endswith("SinusoidalPositionalEmbedding"):
                module.weight.requires_grad_(False)
        for module in self.attention_modules():
            if isinstance(module, VariantAttention):
                module.freeze_fixed_weights()

    @torch.no_grad()
    def initialize_weights(self):
        """Base init, then each variant's own parameters (`transformers.initialization` helpers skip loaded
        tensors, so a warm start keeps every weight it loaded)."""
        super().initialize_weights()
        for module in self.attention_modules():
            if isinstance(module, VariantAttention):  # (the stock modules, before the swap in __init__)
                module.init_variant_weights(init)

    # ---- forward ----------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attention_details: bool = False,
        **kwargs,
    ) -> HfAttnSeq2SeqLMOutput:
        """The base model's forward; ``output_attention_details=True`` also returns the variants' internal maps."""
        cache = pop_cache(cache, kwargs)  # (``past_key_values`` before transformers 5.24)
        if isinstance(cache, EncoderDecoderCache):  # decoding state lives in the cache
            cache = HfAttnCache.wrap(cache)
        # generate() with a static cache prepares the masks with our mask function (a KeepMask); transformers passes
        # only a 4D tensor through as prepared, so hand it the dense form
        if is_prepared_keep_mask(attention_mask):
            attention_mask = attention_mask.dense()
        if is_prepared_keep_mask(decoder_attention_mask):
            decoder_attention_mask = decoder_attention_mask.dense()
        state = ForwardState(details={} if output_attention_details else None)
        return_dict = kwargs.pop("return_dict", None)
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            **{CACHE_KWARG: cache},
            **kwargs,
        )
        call = inputs  # (``inputs``: as the caller gave them, for the variants' model-level hooks)
        if cache is None and labels is None and (self.config.use_cache if use_cache is None else use_cache):
            # the cache the decoder would create, as an HfAttnCache (stock transformers makes a plain one)
            call = {**inputs, CACHE_KWARG: HfAttnCache(DynamicCache(config=self.config), DynamicCache(config=self.config))}
        # attention weights or the variants' internal maps exist only on the eager path: the fused kernels never
        # materialise them (analysis asks for them this way)
        wants_maps = output_attention_details or kwargs.get("output_attentions") or self.config.output_attentions
        if wants_maps:
            set_eager_attention(self.attention_modules(), True)
        try:
            out = super().forward(**call, return_dict=True, **{FORWARD_STATE_KWARG: state})
        finally:
            if wants_maps:
                self._apply_eager_request()
        # a pure inference call (generate, transformers' inference checks) has no loss the auxiliary terms could
        # be part of: it returns exactly stock's fields
        pure_inference = not self.training and labels is None and not torch.is_grad_enabled()
        aux_loss, aux_logs = (None, None) if pure_inference else self._model_losses(out, inputs, state)
        loss = out.loss
        if loss is not None and aux_loss is not None:
            loss = loss + aux_loss
        result = HfAttnSeq2SeqLMOutput(
            loss=loss,
            aux_loss=aux_loss,
            aux_logs=aux_logs,
            attention_details=state.details,
            **{k: v for k, v in out.items() if k != "loss"},
        )
        if self.training and torch.is_grad_enabled():
            problem = self._training_problem(labels, aux_loss is not None)
            if problem is not None:
                self._fail_on_backward(result, problem, excused_by_aux_loss=labels is None and aux_loss is not None)
        if return_dict is False or (return_dict is None and not self.config.return_dict):
            return result.to_tuple()  # the loss (with the auxiliary loss) leads, as in stock transformers
        return result

    def _training_problem(self, labels, has_aux_loss: bool = False) -> str | None:
        """Why a training step through this forward pass would silently train the wrong thing (a variant's
        objective that vanishes, a schedule that stands still), or None (docs/training.md, "Auxiliary losses and
        other trainers").

        The objective needs ``labels`` in the forward call: a loop that drops them to compute its own loss
        (transformers' `Seq2SeqTrainer` under label smoothing) would train without it, unless it adds ``aux_loss``
        itself (``has_aux_loss``: this forward computed it without labels, as ReLUFormer's regulariser is)."""
        classes = self.variant_classes()
        needs_labels = [c.variant for c in classes if c.training_objective(self.config)]
        if labels is None and needs_labels:
            what = f"preset {self.config.preset!r}" if getattr(self.config, "preset", None) else \
                f"attention variant {needs_labels[0]!r}"
            return (
                f"{what} adds an auxiliary objective to the training loss, so the model needs `labels` in every "
                "training forward that is backpropagated (a loop that drops them to smooth the labels itself, as "
                "transformers' Seq2SeqTrainer does with label smoothing, would train without it): with transformers' "
                "example scripts pass --label_smoothing_factor 0; in your own code "
                + ("pass labels or add out.aux_loss to the loss you backpropagate" if has_aux_loss else
                   "pass labels (its objective is computed from them; add out.aux_loss to a loss of your own)")
                + ", or train with hf_attn.training.HfAttnSeq2SeqTrainer"
            )
        if not self._step_driven and any(c.needs_training_step(self.config) for c in classes):
            return (
                "this model's attention schedule follows the optimiser step (calibration_fusion='anneal'), but "
                "set_training_step was never called: call model.set_training_step(step) before each step, or add "
                "hf_attn.training.TrainingStepCallback() to the trainer's callbacks"
            )
        return None

    @staticmethod
    def _fail_on_backward(out: HfAttnSeq2SeqLMOutput, message: str, excused_by_aux_loss: bool = False) -> None:
        """Raise `HfAttnConfigError` (``message``) when a backward pass reaches the outputs of this forward pass.

        The error belongs to the step that computes a loss from the outputs and backpropagates it (the first
        training step of a loop that would lose the objective), not to the forward pass itself: a train-mode
        forward that is only looked at (a freshly built model run for inference, ``resize_token_embeddings``
        checks) is fine. ``excused_by_aux_loss``: a loop without labels that adds ``out.aux_loss`` to its own loss
        (docs/python.md, "A training loop of your own") keeps the objective; the backward passes when the
        auxiliary loss is among what it reached (one hook over all outputs sees every gradient of that pass)."""
        tensors = [tensor for value in out.values() for tensor in (value if isinstance(value, tuple) else (value,))
                   if isinstance(tensor, torch.Tensor) and tensor.requires_grad]
        aux = next((i for i, t in enumerate(tensors) if t is out.aux_loss), None) if excused_by_aux_loss else None

        def check(grads):
            if aux is not None and grads[aux] is not None:
                return  # the auxiliary loss is part of the loss being backpropagated
            if any(g is not None for g in grads):
                raise HfAttnConfigError(message)

        if tensors:
            torch.autograd.graph.register_multi_grad_hook(tensors, check)

    def _model_losses(self, out, inputs: dict, state: ForwardState):
        """(aux_loss or None, aux_logs or None) from the layers' losses and each variant's `model_losses` hook."""
        terms = [t for values in state.losses.values() for t in values]
        for cls in self.variant_classes():
            losses, logs = cls.model_losses(self, out, inputs, state)
            terms += list(losses.values())
            for key, value in logs.items():
                state.log(key, value)
        aux_loss = torch.stack([t.float() for t in terms]).sum() if terms else None
        aux_logs = {k: torch.stack(v).mean() for k, v in state.logs.items()} or None
        return aux_loss, aux_logs

    # ---- training / generation hooks ----------------------------------------------------------------------------
    def set_training_step(self, step: int) -> None:
        """Tell step-driven variants (attention calibration's anneal) the optimiser step."""
        self._step_driven = True
        for module in self.attention_modules():
            module.set_training_step(step)

    def max_target_positions(self) -> int | None:
        """The longest target the variants can handle (None: no limit beyond the position embeddings)."""
        limits = [cls.max_positions(self.config) for cls in self.variant_classes()]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None

    def _prepare_generated_length(self, generation_config, *args, **kwargs):
        """transformers' target length (its defaults, ``max_length`` / ``max_new_tokens``), then capped at the
        variants' hard limit (RAN's and the Synthesizer's Lmax): never raised, so the default stays stock's."""
        generation_config = super()._prepare_generated_length(generation_config, *args, **kwargs)
        limit = self.max_target_positions()
        if limit is not None and generation_config.max_length > limit:
            generation_config.max_length = limit
        return generation_config


# GenerationMixin is a direct base, as in transformers' own MarianMTModel / BartForConditionalGeneration:
# transformers 5 expects it of every model that generates (PreTrainedModel no longer inherits it)
class HfAttnMarianMTModel(HfAttnModelMixin, MarianMTModel, GenerationMixin):
    """`MarianMTModel` with hf-attn attention variants (see `HfAttnMarianConfig`)."""

    config_class = HfAttnMarianConfig
    base_attention_class = MarianAttention


class HfAttnBartForConditionalGeneration(HfAttnModelMixin, BartForConditionalGeneration, GenerationMixin):
    """`BartForConditionalGeneration` with hf-attn attention variants (see `HfAttnBartConfig`)."""

    config_class = HfAttnBartConfig
    base_attention_class = BartAttention
