"""The model code. Every file here but `bases.py` (the library's table of base architectures) ships to the Hub with a
model, copied flat by save_pretrained: sibling imports only."""

from .attention_base import VariantAttention
from .bases import BASES, Base, base_of, get_base, register_auto_classes
from .configuration_hf_attn import HfAttnBartConfig, HfAttnMarianConfig
from .hyperparameters import HfAttnConfigError, Preset
from .modeling_hf_attn import HfAttnBartForConditionalGeneration, HfAttnMarianMTModel, HfAttnSeq2SeqLMOutput
from .presets import PRESETS
from .registry import ATTENTION_VARIANTS

register_auto_classes()  # AutoConfig / AutoModelForSeq2SeqLM load hf-attn directories (hf_attn/autoregister.py)
