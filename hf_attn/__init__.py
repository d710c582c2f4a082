"""hf-attn: published NMT attention mechanisms for Hugging Face Marian and BART models.

The names below load on first use (PEP 562), so that ``import hf_attn`` and the ``hf-attn`` command's parsing do not
import torch and transformers (`hf-attn --help` answers at once). ``import hf_attn`` still registers the model types
``hf_attn_marian`` / ``hf_attn_bart`` with ``AutoConfig`` / ``AutoModelForSeq2SeqLM``: now, when transformers is
already imported, else as soon as it is (`autoregister`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import autoregister
from .lazy import lazy_names
from .version import __version__

_EXPORTS = {  # public name -> the module that defines it
    "ATTENTION_VARIANTS": ".modeling",
    "PRESETS": ".modeling",
    "HfAttnBartConfig": ".modeling",
    "HfAttnBartForConditionalGeneration": ".modeling",
    "HfAttnConfigError": ".modeling",
    "HfAttnMarianConfig": ".modeling",
    "HfAttnMarianMTModel": ".modeling",
    "HfAttnSeq2SeqLMOutput": ".modeling",
    "Preset": ".modeling",
    "swap_attention": ".swap",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and the API reference (mkdocstrings reads these); at run time: `__getattr__`
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


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())

autoregister.when_transformers_loads()  # `import hf_attn` is enough for AutoModelForSeq2SeqLM to load hf-attn dirs
