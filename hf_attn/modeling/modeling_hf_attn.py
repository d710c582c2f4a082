"""Marian and BART encoder-decoders whose attention layers are swapped for hf-attn variants.

Each model subclasses the stock transformers class, forces the ``"hf_attn"`` attention implementation (so every
layer receives a boolean keep mask), then replaces ``layer.self_attn`` / ``layer.encoder_attn`` per the config
with ``attention_class(MarianAttention | BartAttention, variant)``. The q/k/v/out parameter names are unchanged,
so a vanilla checkpoint warm-starts every shared weight.

Variant hooks the model calls (all optional, defined on the variant mixin):
  ``attach(model)``            once after the swap (stack-level parameters, e.g. RAN's A0; one owner each)
  ``model_losses(model, outputs, inputs)``   extra passes / losses at the model level (attention calibration)
  module ``aux_losses`` / ``aux_logs``  dicts a module fills during forward (weighted losses, values to log)
  module ``reorder_state(beam_idx)``   per-hypothesis state outside the KV cache (beam search)
  module ``set_training_step(step)``   optimiser-step-driven schedules
  ``max_positions(config)``   hard length limit (e.g. RAN's Lmax): generation is capped to it
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import BartForConditionalGeneration, MarianMTModel
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.models.bart.modeling_bart import BartAttention
from transformers.models.marian.modeling_marian import MarianAttention

from .attention_base import ATTN_IMPLEMENTATION, SITES, HfAttnConfigError, VariantAttention, attention_class
from .configuration_hf_attn import HfAttnBartConfig, HfAttnMarianConfig
from .registry import ATTENTION_VARIANTS


@dataclass
class HfAttnSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus the variants' auxiliary loss (already weighted; included in ``loss`` when labels
    are given) and scalars to log (``aux_logs``)."""

    aux_loss: torch.FloatTensor | None = None
    aux_logs: dict | None = None


class HfAttnModelMixin:
    """Shared by `HfAttnMarianMTModel` and `HfAttnBartForConditionalGeneration`."""

    base_attention_class: type = MarianAttention
    accepts_loss_kwargs = False  # HF_NOTES trap 7: the loss is a mean over tokens; Trainer must not re-normalise

    def __init__(self, config):
        config._attn_implementation = ATTN_IMPLEMENTATION  # HF_NOTES trap 3: not saved in config.json
        super().__init__(config)
        self.config._attn_implementation = ATTN_IMPLEMENTATION
        self._swap_attention_modules()
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
                layer_idx=i,  # Marian's encoder passes None (HF_NOTES): indices are set here for every site
                site=site,
            )
            setattr(layer, attr, new)
        for cls in self.variant_classes():
            if hasattr(cls, "attach"):
                cls.attach(self)

    def variant_classes(self) -> list[type]:
        """The variant mixins used by this model, in registry order."""
        used = {v for layout in self.config.attention_layout().values() for v in layout}
        return [cls for name, cls in ATTENTION_VARIANTS.items() if name in used]

    def attention_modules(self, site: str | None = None) -> list[VariantAttention]:
        """Every attention module (optionally of one site: 'encoder', 'decoder', 'cross'), in layer order."""
        if site is not None and site not in SITES:
            raise HfAttnConfigError(f"site={site!r} is not valid; choose one of {list(SITES)}")
        return [getattr(layer, attr) for s, _, layer, attr in self._attention_slots() if site in (None, s)]

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, then `freeze_fixed_weights` (loading replaces frozen tensors)."""
        loaded = super().from_pretrained(*args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_fixed_weights()
        return loaded

    def freeze_fixed_weights(self) -> None:
        """Keep fixed tensors fixed after loading: transformers 5.23's loader swaps in fresh trainable Parameters,
        so Marian's sinusoidal position table (and a variant's frozen tensors, via the module hook
        ``freeze_fixed_weights``) would silently start learning when a saved model is fine-tuned or resumed."""
        for module in self.modules():
            if module is self:
                continue
            if type(module).__name__.endswith("SinusoidalPositionalEmbedding"):
                module.weight.requires_grad_(False)
            elif hasattr(module, "freeze_fixed_weights"):
                module.freeze_fixed_weights()

    @torch.no_grad()
    def initialize_weights(self):
        """Base init, then each variant's own parameters (HF_NOTES traps 4-5: the helpers skip loaded tensors)."""
        from transformers import initialization as init

        super().initialize_weights()
        for module in self.modules():
            if isinstance(module, VariantAttention) or hasattr(module, "init_variant_weights"):
                module.init_variant_weights(init)

    # ---- forward ----------------------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs=None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> HfAttnSeq2SeqLMOutput:
        modules = self.attention_modules()
        for m in modules:
            m.aux_losses, m.aux_logs = {}, {}
        inputs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            **kwargs,
        )
        out = super().forward(**inputs)
        if not isinstance(out, Seq2SeqLMOutput):  # return_dict=False
            return out
        aux_terms, logs = [], {}
        for m in modules:
            aux_terms += list(getattr(m, "aux_losses", {}).values())
            for key, value in getattr(m, "aux_logs", {}).items():
                logs.setdefault(key, []).append(value.detach().float())
        for cls in self.variant_classes():
            if hasattr(cls, "model_losses"):
                losses, extra_logs = cls.model_losses(self, out, inputs)
                aux_terms += list(losses.values())
                for key, value in extra_logs.items():
                    logs.setdefault(key, []).append(value.detach().float())
        aux_loss = torch.stack([t.float() for t in aux_terms]).sum() if aux_terms else None
        loss = out.loss
        if loss is not None and aux_loss is not None:
            loss = loss + aux_loss
        return HfAttnSeq2SeqLMOutput(
            loss=loss,
            aux_loss=aux_loss,
            aux_logs={k: torch.stack(v).mean() for k, v in logs.items()} or None,
            **{k: v for k, v in out.items() if k != "loss"},
        )

    # ---- training / generation hooks ----------------------------------------------------------------------------
    def set_training_step(self, step: int) -> None:
        """Tell step-driven variants (attention calibration's anneal) the optimiser step."""
        for m in self.modules():
            if m is not self and hasattr(m, "set_training_step"):
                m.set_training_step(step)

    def _reorder_cache(self, past_key_values, beam_idx):
        for m in self.modules():
            if hasattr(m, "reorder_state"):
                m.reorder_state(beam_idx)
        if hasattr(past_key_values, "reorder_cache"):
            past_key_values.reorder_cache(beam_idx)
        return past_key_values

    def max_target_positions(self) -> int | None:
        """The longest target the variants can handle (None: no limit beyond the position embeddings)."""
        limits = [cls.max_positions(self.config) for cls in self.variant_classes() if hasattr(cls, "max_positions")]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None

    def generate(self, *args, **kwargs):
        limit = self.max_target_positions()
        if limit is not None:
            gen = kwargs.get("generation_config") or self.generation_config
            max_length = kwargs.get("max_length") or gen.max_length
            if kwargs.get("max_new_tokens") is not None or getattr(gen, "max_new_tokens", None) is not None:
                kwargs["max_new_tokens"] = min(kwargs.get("max_new_tokens") or gen.max_new_tokens, limit - 1)
            elif max_length is None or max_length > limit:
                kwargs["max_length"] = limit
        return super().generate(*args, **kwargs)


class HfAttnMarianMTModel(HfAttnModelMixin, MarianMTModel):
    """`MarianMTModel` with hf-attn attention variants (see `HfAttnMarianConfig`)."""

    config_class = HfAttnMarianConfig
    base_attention_class = MarianAttention


class HfAttnBartForConditionalGeneration(HfAttnModelMixin, BartForConditionalGeneration):
    """`BartForConditionalGeneration` with hf-attn attention variants (see `HfAttnBartConfig`)."""

    config_class = HfAttnBartConfig
    base_attention_class = BartAttention
