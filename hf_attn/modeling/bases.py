"""The two base architectures, in one table: for each, hf-attn's config and model classes, the stock transformers
model and config classes it extends, and the stock attention class the variants are mixed into.

Library-side only (the shipped model code does not need it): `swap_attention`, training, the tests and the benchmark
scripts look a base up here instead of switching on Marian / BART themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import AutoConfig, AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel
from transformers.models.bart.modeling_bart import BartAttention
from transformers.models.marian.modeling_marian import MarianAttention

from .configuration_hf_attn import HfAttnBartConfig, HfAttnMarianConfig
from .hyperparameters import HfAttnConfigError
from .modeling_hf_attn import HfAttnBartForConditionalGeneration, HfAttnMarianMTModel


@dataclass(frozen=True)
class Base:
    """One base architecture."""

    name: str  # "marian" / "bart": the `--base` value, the tokenizer family
    title: str  # "Marian" / "BART", for cards and reports
    config_class: type  # hf-attn's config
    model_class: type  # hf-attn's model
    stock_config_class: type  # transformers' config it extends
    stock_model_class: type  # transformers' model it extends
    attention_class: type  # transformers' attention module the variants are mixed into

    @property
    def model_types(self) -> tuple[str, str]:
        """The config ``model_type`` of the stock and of the hf-attn model."""
        return self.stock_config_class.model_type, self.config_class.model_type


BASES: dict[str, Base] = {
    "marian": Base("marian", "Marian", HfAttnMarianConfig, HfAttnMarianMTModel, MarianConfig, MarianMTModel,
                   MarianAttention),
    "bart": Base("bart", "BART", HfAttnBartConfig, HfAttnBartForConditionalGeneration, BartConfig,
                 BartForConditionalGeneration, BartAttention),
}


def register_auto_classes() -> None:
    """Make ``AutoConfig`` / ``AutoModelForSeq2SeqLM`` load hf-attn directories as hf-attn classes, and make
    ``save_pretrained`` write ``auto_map`` and copy the model code (both calls are needed). Idempotent."""
    for base in BASES.values():
        AutoConfig.register(base.config_class.model_type, base.config_class, exist_ok=True)
        AutoModelForSeq2SeqLM.register(base.config_class, base.model_class, exist_ok=True)
        base.config_class.register_for_auto_class()
        base.model_class.register_for_auto_class("AutoModelForSeq2SeqLM")


def get_base(name: str) -> Base:
    """``BASES[name]``, or one `HfAttnConfigError` line naming the valid bases."""
    if name not in BASES:
        raise HfAttnConfigError(f"--base {name!r} is not valid; valid: {', '.join(BASES)}")
    return BASES[name]


def base_of(model_or_config) -> Base | None:
    """The base of a model (stock or hf-attn) or of a config, by class or ``model_type``; None for any other."""
    config = getattr(model_or_config, "config", model_or_config)
    model_type = getattr(config, "model_type", None)
    for base in BASES.values():
        if isinstance(model_or_config, (base.stock_model_class, base.stock_config_class)) or model_type in base.model_types:
            return base
    return None
