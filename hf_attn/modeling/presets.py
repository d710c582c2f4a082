"""Named configurations: each paper's method, its baselines and its ablations, as declared by the variants.

A preset is a set of config overrides: the attention variant per site (``encoder_attention``,
``decoder_attention``, ``cross_attention``), optional layer subsets, and variant hyperparameters.
"""

from __future__ import annotations

from .hyperparameters import Preset
from .registry import ATTENTION_VARIANTS

PRESETS: dict[str, Preset] = {p.name: p for cls in ATTENTION_VARIANTS.values() for p in cls.presets}
