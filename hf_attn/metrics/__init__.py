"""`evaluate` metric modules shipped with the package, for code written against the `evaluate` API.

``evaluate.load("sacrebleu")`` downloads its script from the Hub; these load from a local path instead::

    from hf_attn.metrics import load_metric
    bleu = load_metric("sacrebleu")          # == evaluate.load(<path of hf_attn_sacrebleu.py>)
    bleu.compute(predictions=["a b c"], references=[["a b c"]])["score"]

Scripts that call ``evaluate.load("sacrebleu")`` by name (transformers' `run_translation.py`): `install_metrics(DIR)`
(``hf-attn metrics DIR``) writes ``DIR/sacrebleu/sacrebleu.py`` and ``DIR/chrf/chrf.py``; `evaluate.load` looks for a
directory of that name holding a script of that name in the working directory before it asks the Hub, so a script
run from DIR loads them, offline.
"""

from __future__ import annotations

from pathlib import Path

METRICS = {"sacrebleu": "hf_attn_sacrebleu.py", "chrf": "hf_attn_chrf.py"}


def metric_path(name: str) -> str:
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {sorted(METRICS)}")
    return str(Path(__file__).with_name(METRICS[name]))


def install_metrics(directory: str | Path = ".") -> list[Path]:
    """Write ``<directory>/<name>/<name>.py`` for every metric here (the layout `evaluate.load(name)` loads from the
    working directory); returns the written files."""
    import shutil

    written = []
    for name in METRICS:
        target = Path(directory) / name / f"{name}.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(metric_path(name), target)
        written.append(target)
    return written


def load_metric(name: str, **kwargs):
    import evaluate

    return evaluate.load(metric_path(name), **kwargs)
