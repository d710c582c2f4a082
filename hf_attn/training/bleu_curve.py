"""Validation BLEU along training (``hf-attn train --eval_bleu_every N --eval_bleu_sentences M``): every ``N``
optimizer steps the model translates a fixed subset of ``M`` validation pairs and sacrebleu scores it, so a record
shows where a gap between presets opens, holds or closes, not only the end point.

The subset is the same for every run of a corpus: ``M`` verses evenly spaced over the validation split (its first,
then every ``len // M``-th), so it spans the whole split rather than its first chapter. The curve
(``[[step, BLEU, chrF], ...]``) is written into every checkpoint (``bleu_curve.json``) and read back on ``--resume``,
so a resumed run's record holds the whole curve. A warm-started run (``--init_from``) also scores step 0, the model it
starts from before any update (for a retrofit, the swapped model: what the swap costs). Decoding uses ``--eval_bleu_beams`` (default 1: greedy, cheap; the
test split keeps ``--num_beams``)."""

from __future__ import annotations

import json
import os

from transformers import TrainerCallback

from ..generation import translate_texts
from .metrics import score_translations

CURVE_FILE = "bleu_curve.json"


def fixed_subset(sources: list[str], references: list[str], n: int) -> tuple[list[str], list[str]]:
    """``n`` pairs evenly spaced over the split (all of it when it has ``n`` or fewer)."""
    if n >= len(sources):
        return list(sources), list(references)
    stride = len(sources) // n
    idx = [i * stride for i in range(n)]
    return [sources[i] for i in idx], [references[i] for i in idx]


class ValidationBleuCallback(TrainerCallback):
    """Every ``every`` steps (on the main process), translate ``sources`` and append [step, BLEU, chrF] to
    ``curve``; with ``at_start``, also before the first update (step 0). The model goes back to training mode
    afterwards."""

    def __init__(self, tokenizer, sources: list[str], references: list[str], every: int, num_beams: int = 1,
                 max_source_length: int = 128, batch_size: int = 64, resume_from: str | None = None,
                 at_start: bool = False):
        self.tokenizer, self.sources, self.references = tokenizer, sources, references
        self.every, self.num_beams = int(every), int(num_beams)
        self.max_source_length, self.batch_size = max_source_length, batch_size
        self.at_start = at_start
        self.curve: list[list] = self.read_curve(resume_from)

    @staticmethod
    def read_curve(checkpoint: str | None) -> list[list]:
        """The curve saved in ``checkpoint`` (empty without one)."""
        path = os.path.join(checkpoint, CURVE_FILE) if checkpoint else None
        if not path or not os.path.isfile(path):
            return []
        with open(path, encoding="utf-8") as f:
            return [list(p) for p in json.load(f)]

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.at_start and int(state.global_step) == 0:
            self._score(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if int(state.global_step) % self.every == 0:
            self._score(state, model)

    def _score(self, state, model) -> None:
        step = int(state.global_step)
        if not state.is_world_process_zero or any(p[0] == step for p in self.curve):
            return
        target = getattr(model, "module", model)
        was_training = target.training
        hyps = translate_texts(target, self.tokenizer, self.sources, num_beams=self.num_beams,
                               batch_size=self.batch_size, max_source_length=self.max_source_length, progress=False)
        if was_training:
            target.train()
        scores = score_translations(hyps, self.references)
        self.curve.append([step, scores["bleu"], scores["chrf"]])

    def write_checkpoint_files(self, ckpt: str, state) -> None:
        """Called by `HfAttnSeq2SeqTrainer` while checkpoint ``ckpt`` is being written."""
        with open(os.path.join(ckpt, CURVE_FILE), "w", encoding="utf-8") as f:
            json.dump(self.curve, f)

    def record(self) -> dict:
        """What results.json keeps: the settings and the curve."""
        return {"every": self.every, "sentences": len(self.sources), "num_beams": self.num_beams,
                "subset": "evenly spaced over the validation split", "curve": self.curve}
