"""Named configurations: each paper's method, its baselines and its ablations, as declared by the variants.

A preset is a set of config overrides: the attention variant per site (``encoder_attention``,
``decoder_attention``, ``cross_attention``), optional layer subsets, and variant hyperparameters.
"""

from __future__ import annotations

from .hyperparameters import HfAttnConfigError, Preset, did_you_mean
from .registry import ATTENTION_VARIANTS

PRESETS: dict[str, Preset] = {p.name: p for cls in ATTENTION_VARIANTS.values() for p in cls.presets}


def check_preset(name: str, label: str, hint: str = "") -> Preset:
    """``PRESETS[name]``, or one `HfAttnConfigError` line: ``<label> 'x' is not a preset (did you mean 'y'?)<hint>``
    (``label`` names where the value came from, ``hint`` what to do)."""
    if name not in PRESETS:
        raise HfAttnConfigError(f"{label} {name!r} is not a preset{did_you_mean(name, PRESETS)}{hint}")
    return PRESETS[name]
