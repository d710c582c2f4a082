"""hf-attn: published NMT attention mechanisms for Hugging Face Marian and BART models."""

from transformers import AutoConfig, AutoModelForSeq2SeqLM

from .modeling import (
    ATTENTION_VARIANTS,
    PRESETS,
    HfAttnBartConfig,
    HfAttnBartForConditionalGeneration,
    HfAttnConfigError,
    HfAttnMarianConfig,
    HfAttnMarianMTModel,
    HfAttnSeq2SeqLMOutput,
    Preset,
)
from .swap import swap_attention

__version__ = "0.1.0"

for _config, _model in (
    (HfAttnMarianConfig, HfAttnMarianMTModel),
    (HfAttnBartConfig, HfAttnBartForConditionalGeneration),
):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_config, _model, exist_ok=True)
    # save_pretrained writes auto_map and copies the modeling files (both calls are needed)
    _config.register_for_auto_class()
    _model.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "ATTENTION_VARIANTS",
    "PRESETS",
    "HfAttnBartConfig",
    "HfAttnBartForConditionalGeneration",
    "HfAttnConfigError",
    "HfAttnMarianConfig",
    "HfAttnMarianMTModel",
    "HfAttnSeq2SeqLMOutput",
    "Preset",
    "swap_attention",
]
