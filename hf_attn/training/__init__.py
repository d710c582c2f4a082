"""Training glue: the Seq2SeqTrainer subclass, metrics, the main job, checkpoint conversion, model cards and Hub
upload."""

from .convert import convert_checkpoint
from .metrics import Seq2SeqMetrics, score_translations
from .trainer import HfAttnSeq2SeqTrainer, StopOnSignalCallback, TimeBudgetCallback, TrainingStepCallback

__all__ = ["HfAttnSeq2SeqTrainer", "Seq2SeqMetrics", "StopOnSignalCallback", "TimeBudgetCallback", "TrainingStepCallback",
           "convert_checkpoint", "score_translations"]
