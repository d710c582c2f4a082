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

__all__ = ["METRICS", "install_metrics", "load_metric", "metric_path"]

METRICS = {"sacrebleu": "hf_attn_sacrebleu.py", "chrf": "hf_attn_chrf.py"}  # metric name -> its module here


def metric_path(name: str) -> str:
    """The path of the `evaluate` module of metric ``name`` (a key of `METRICS`); `ValueError` for another name."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; valid: {sorted(METRICS)}")
    return str(Path(__file__).with_name(METRICS[name]))


def install_metrics(directory: str | Path = ".") -> list[Path]:
    """Write ``<directory>/<name>/<name>.py`` for every metric here (the layout `evaluate.load(name)` loads from the
    working directory); returns the written files."""
    import shutil

    from ..io_utils import ensure_writable_dir

    root = ensure_writable_dir(directory, "DIR")  # else one line naming it (`hf-attn metrics DIR`), no traceback
    written = []
    for name in METRICS:
        target = ensure_writable_dir(root / name, f"DIR/{name}") / f"{name}.py"
        shutil.copyfile(metric_path(name), target)
        written.append(target)
    return written


def load_metric(name: str, **kwargs):
    """``evaluate.load`` of the module shipped here for ``name`` ("sacrebleu" or "chrf"): the same metric as
    ``evaluate.load(name)``, without the Hub. ``kwargs`` go to `evaluate.load`."""
    import evaluate

    return evaluate.load(metric_path(name), **kwargs)
