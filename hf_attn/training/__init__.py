"""Training glue: the Seq2SeqTrainer subclass and its callbacks, metrics, evaluation, checkpoint conversion, model
cards and Hub upload. The public names below are defined in the submodules `_EXPORTS` names (docs/api.md documents
them there) and imported on first use, so that ``import hf_attn.training.validate`` (the command line's flag
checks) does not import transformers' Trainer."""

from __future__ import annotations

from ..lazy import lazy_names

_EXPORTS = {
    "HfAttnSeq2SeqTrainer": ".trainer",
    "TrainingStepCallback": ".trainer",
    "TimeBudgetCallback": ".trainer",
    "StopOnSignalCallback": ".trainer",
    "Seq2SeqMetrics": ".metrics",
    "score_translations": ".metrics",
    "evaluate_dir": ".run",
    "convert_checkpoint": ".convert",
    "write_model_card": ".cards",
    "push_model_dir": ".hub",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
