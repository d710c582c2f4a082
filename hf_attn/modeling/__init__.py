"""Everything that ships to the Hub with a model (copied flat by save_pretrained: sibling imports only)."""

from .attention_base import VariantAttention
from .configuration_hf_attn import HfAttnBartConfig, HfAttnMarianConfig
from .hyperparameters import HfAttnConfigError, Preset
from .modeling_hf_attn import HfAttnBartForConditionalGeneration, HfAttnMarianMTModel, HfAttnSeq2SeqLMOutput
from .presets import PRESETS
from .registry import ATTENTION_VARIANTS
