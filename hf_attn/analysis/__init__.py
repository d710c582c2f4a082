"""Analysis of learned attention (library code; never shipped to the Hub): the public names below, each defined in
the submodule `_EXPORTS` names (docs/api.md documents them there). They are imported on first use, so that
``import hf_attn.analysis.options`` (the command line's flags) stays light."""

from __future__ import annotations

from ..lazy import lazy_names

_EXPORTS = {
    "AnalyzeOptions": ".options",
    "analyze_dirs": ".report",
    "attention_report": ".stats",
    "format_report": ".stats",
    "collect_attentions": ".stats",
    "layer_statistics": ".stats",
    "sparsity_rate": ".stats",
    "null_rows": ".stats",
    "null_rate": ".stats",
    "entropy": ".stats",
    "head_diversity": ".stats",
    "alignment_error_rate": ".stats",
    "plot_attention_heads": ".stats",
    "plot_layer_statistics": ".stats",
    "gmm_parameters": ".gmm",
    "learned_attention": ".ran",
    "calibration_maps": ".calibration",
    "write_viewer": ".viewer",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
