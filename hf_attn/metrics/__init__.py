"""`evaluate` metric modules shipped with the package, for code written against the `evaluate` API.

``evaluate.load("sacrebleu")`` downloads its script from the Hub; these load from a local path instead::

    from hf_attn.metrics import load_metric
    bleu = load_metric("sacrebleu")          # == evaluate.load(<path of hf_attn_sacrebleu.py>)
    bleu.compute(predictions=["a b c"], references=[["a b c"]])["score"]
"""

from __future__ import annotations

from pathlib import Path

METRICS = {"sacrebleu": "hf_attn_sacrebleu.py", "chrf": "hf_attn_chrf.py"}


def metric_path(name: str) -> str:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {sorted(METRICS)}")
    return str(Path(__file__).with_name(METRICS[name]))


def load_metric(name: str, **kwargs):
    import evaluate

    return evaluate.load(metric_path(name), **kwargs)
