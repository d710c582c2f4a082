"""Training glue: the Seq2SeqTrainer subclass, metrics, the main job, checkpoint conversion, model cards and Hub
upload.

The names load on first use (PEP 562): `hf-attn train` parses its flags (`training.args`) without importing the
Trainer, the data stack and the metrics."""

import importlib

_EXPORTS = {
    "convert_checkpoint": ".convert",
    "Seq2SeqMetrics": ".metrics",
    "score_translations": ".metrics",
    "HfAttnSeq2SeqTrainer": ".trainer",
    "StopOnSignalCallback": ".trainer",
    "TimeBudgetCallback": ".trainer",
    "TrainingStepCallback": ".trainer",
}

__all__ = ["HfAttnSeq2SeqTrainer", "Seq2SeqMetrics", "StopOnSignalCallback", "TimeBudgetCallback", "TrainingStepCallback",
           "convert_checkpoint", "score_translations"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
