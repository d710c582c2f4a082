"""hf-attn: published NMT attention mechanisms for Hugging Face Marian and BART models."""

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
from .modeling.bases import register_auto_classes
from .swap import swap_attention
from .version import __version__


register_auto_classes()  # `import hf_attn` is enough for AutoModelForSeq2SeqLM to load hf-attn directories

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
