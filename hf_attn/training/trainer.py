"""`Seq2SeqTrainer` glue for hf-attn models.

* Every variant's auxiliary loss (``outputs.aux_loss``, already weighted) is part of the optimised loss, also
  when ``label_smoothing_factor > 0`` makes Trainer pop the labels (the model then returns no loss: HF_NOTES
  trap 8) and with gradient accumulation (the per-micro-batch mean is divided by the accumulation steps exactly
  once: ``model_accepts_loss_kwargs`` is forced off, HF_NOTES trap 7).
* ``outputs.aux_logs`` (e.g. ``reg_loss``, ``mean_mask``) are averaged over the logging interval and logged
  beside ``loss``; the number of target tokens trained on is counted for tokens/s.
* `TrainingStepCallback` (added automatically; add it to a stock ``Seq2SeqTrainer`` yourself) tells the model the
  optimiser step before each step (``model.set_training_step``: attention calibration's annealing).
* `TimeBudgetCallback` stops training after a wall-clock budget (kept across ``--resume``) and agrees on the
  stopping step across processes (DDP).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict

import torch
from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer_callback import ProgressCallback


def _scalar(v) -> float | None:
    if v is None:
        return None
    if torch.is_tensor(v):
        if v.numel() != 1:
            v = v.float().mean()
        return float(v.detach().float().cpu())
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class HfAttnSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` that trains on translation loss + the variants' auxiliary losses and logs them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(TrainingStepCallback())
        # The model's loss is a per-micro-batch mean: Trainer must divide it by the accumulation steps (trap 7).
        self.model_accepts_loss_kwargs = False
        self._aux_sums: dict[str, float] = defaultdict(float)
        self._aux_counts: dict[str, int] = defaultdict(int)
        self.train_target_tokens = 0

    # ------------------------------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # With label smoothing, Trainer pops `labels` and smooths the logits itself (trap 8). We keep them in the
        # inputs instead: variants whose auxiliary loss needs the targets (attention calibration's perturbed pass)
        # see them whole; the model's unsmoothed loss is then ignored in favour of the smoothed one + aux_loss.
        labels = inputs["labels"] if self.label_smoother is not None and "labels" in inputs else None
        if model.training and "labels" in inputs or labels is not None:
            lab = inputs["labels"] if labels is None else labels
            if model.training:
                self.train_target_tokens += int((lab != -100).sum())
        outputs = model(**inputs)
        aux = outputs.get("aux_loss") if hasattr(outputs, "get") else None
        if labels is not None:
            # smooth here and add the auxiliary loss (trap 8)
            loss = self.label_smoother(outputs, labels)
            if aux is not None:
                loss = loss + aux
        else:
            loss = outputs.get("loss") if hasattr(outputs, "get") else outputs[0]
            if loss is None:
                raise ValueError("the model returned no loss: pass `labels` (the collator builds them from the targets)")
            # with labels the model's loss already includes aux_loss (hf-attn contract)
        if model.training:
            self._record_aux(outputs, aux)
        return (loss, outputs) if return_outputs else loss

    def _record_aux(self, outputs, aux) -> None:
        if aux is not None:
            v = _scalar(aux)
            if v is not None:
                self._aux_sums["aux_loss"] += v
                self._aux_counts["aux_loss"] += 1
        logs = outputs.get("aux_logs") if hasattr(outputs, "get") else None
        for k, v in (logs or {}).items():
            v = _scalar(v)
            if v is not None and math.isfinite(v):
                self._aux_sums[k] += v
                self._aux_counts[k] += 1

    def log(self, logs: dict, *args, **kwargs) -> None:
        if "loss" in logs and self._aux_counts:
            for k, n in self._aux_counts.items():
                if n:
                    logs[k] = round(self._aux_sums[k] / n, 6)
            self._aux_sums.clear()
            self._aux_counts.clear()
        super().log(logs, *args, **kwargs)



class TrainingStepCallback(TrainerCallback):
    """Before every optimiser step, ``model.set_training_step(global_step)``: the schedule of step-driven variants
    (attention calibration's annealing ratio, Lu et al. 2021 Eq. 9) follows training, and is saved with the model."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        target = getattr(model, "module", model)  # DDP wraps the model
        if hasattr(target, "set_training_step"):  # any model: a plain transformers model has no schedule
            target.set_training_step(int(state.global_step))


class TimeBudgetCallback(TrainerCallback):
    """Stop training after ``minutes`` of wall-clock training time (summed over resumed runs).

    The elapsed time is saved as ``time_budget.json`` in each checkpoint and read back on resume. Under DDP the
    processes agree (all-reduce MAX) so they stop at the same step."""

    FILE = "time_budget.json"

    def __init__(self, minutes: float | None, already_elapsed: float = 0.0):
        self.budget = None if minutes is None or minutes <= 0 else float(minutes) * 60.0
        self.already = float(already_elapsed)
        self.start = None
        self.trainer = None  # set by the caller for the progress bar description

    def elapsed(self) -> float:
        return self.already + (time.monotonic() - self.start if self.start is not None else 0.0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.budget is None:
            return
        stop = self.elapsed() >= self.budget
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([1.0 if stop else 0.0])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item() > 0)
        if stop:
            control.should_training_stop = True
            control.should_save = True
        self._describe()

    def _describe(self):
        if self.trainer is None or self.budget is None:
            return
        for cb in self.trainer.callback_handler.callbacks:
            if isinstance(cb, ProgressCallback) and getattr(cb, "training_bar", None) is not None:
                cb.training_bar.set_description(f"{self.elapsed() / 60:.1f}/{self.budget / 60:.1f} min")

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(ckpt):
            with open(os.path.join(ckpt, self.FILE), "w") as f:
                json.dump({"elapsed_seconds": self.elapsed(), "budget_seconds": self.budget}, f)

    @classmethod
    def elapsed_in(cls, checkpoint: str | None) -> float:
        if not checkpoint:
            return 0.0
        try:
            with open(os.path.join(checkpoint, cls.FILE)) as f:
                return float(json.load(f)["elapsed_seconds"])
        except (OSError, ValueError, KeyError):
            return 0.0


class InterruptAfterSteps(TrainerCallback):
    """Raise KeyboardInterrupt after ``steps`` optimiser steps (tests use it to interrupt a run)."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            raise KeyboardInterrupt(f"interrupted after step {state.global_step}")
