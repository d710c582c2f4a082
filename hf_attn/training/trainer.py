"""`Seq2SeqTrainer` glue for hf-attn models.

* Every variant's auxiliary loss (``outputs.aux_loss``, already weighted) is part of the optimised loss, also
  when ``label_smoothing_factor > 0`` makes Trainer pop the labels (the model then returns no loss, so an
  auxiliary loss added to it would vanish) and with gradient accumulation (the per-micro-batch mean is divided by
  the accumulation steps exactly once: ``model_accepts_loss_kwargs`` is forced off).
* ``outputs.aux_logs`` (e.g. ``reg_loss``, ``mean_mask``) are averaged over the logging interval and logged
  beside ``loss``; the number of target tokens trained on is counted for tokens/s.
* `TrainingStepCallback` (added automatically; add it to a stock ``Seq2SeqTrainer`` yourself) tells the model the
  optimiser step before each step (``model.set_training_step``: attention calibration's annealing).
* A checkpoint is written under ``.tmp-checkpoint/`` and renamed to ``checkpoint-N`` when complete (a kill during
  a save leaves no half-written checkpoint); the data order of the epoch it was taken in is saved with it, so a
  mid-epoch ``--resume`` sees the same batches as the uninterrupted run.
* A non-finite loss at any step stops training at once (``trainer.diverged`` = (step, loss)).
* `TimeBudgetCallback` stops training after a wall-clock budget (kept across ``--resume``) and agrees on the
  stopping step across processes (DDP).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from collections import defaultdict

import torch
from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import rotate_checkpoints

from ..errors import PREEMPTION_SIGNALS
from .checkpoints import TMP_DIR, newest_complete_checkpoint

SAMPLER_STATE = "sampler_state.pt"


class ResumableLengthGroupedSampler(LengthGroupedSampler):
    """`LengthGroupedSampler` (same order, drawn from the global RNG) that remembers the RNG state each epoch's
    permutation was drawn from, and on resume draws the resumed epoch's permutation from the saved state. Trainer's
    own restore loads the RNG state of the checkpoint, which is the state at the checkpoint's step, not at the start
    of its epoch: a mid-epoch resume then skipped the right number of batches of a different permutation.

    With ``shared`` (DDP, where every process iterates the whole sampler and accelerate's `BatchSamplerShard` keeps
    every n-th batch) every process draws the epoch's permutation from process 0's RNG state: the permutations must
    agree, and the global RNG states agree at the first epoch (one seed) but not after it on CPU processes, since
    dropout draws one number per activation of each process's own batches. Drawing from each process's own state
    gave every epoch after the first repeated and missing examples. (Not with accelerate's ``dispatch_batches``,
    where process 0 alone iterates it: the broadcast would wait for the others forever.)"""

    def __init__(self, *args, shared: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0
        self.shared = shared
        self.drawn: dict | None = None  # {"epoch": e, "rng": ByteTensor}: what this epoch's permutation came from
        self.resume: dict | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self):
        resumed = self.resume is not None and self.resume.get("epoch") == self.epoch
        own = torch.get_rng_state()
        rng = self.resume["rng"] if resumed else _from_process_zero(own) if self.shared else own
        if resumed or not torch.equal(rng, own):  # (the second: a DDP process other than 0 after the first epoch)
            self.generator = torch.Generator().manual_seed(0)
            self.generator.set_state(rng)
        else:
            self.generator = None  # drawn from (and advancing) the global RNG, as `LengthGroupedSampler` does
        self.resume = None
        self.drawn = {"epoch": self.epoch, "rng": rng.clone()}
        return super().__iter__()


def _from_process_zero(state: torch.Tensor) -> torch.Tensor:
    """Process 0's ``state`` on every process (a collective: every process must call it)."""
    box = [state]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


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
        self.diverged: tuple[int, float] | None = None  # (step, loss) of the first non-finite training loss
        self._checkpoint_tmp_root: str | None = None
        self._sampler: ResumableLengthGroupedSampler | None = None
        self._sampler_resume: dict | None = None
        self.add_callback(_StopOnDivergence(self))

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

    # ------------------------------------------------------------------------------------------ divergence
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        value = float(loss.detach().float().sum().cpu()) if torch.is_tensor(loss) else float(loss)
        if not math.isfinite(value) and self.diverged is None:
            self.diverged = (int(self.state.global_step) + 1, value)
        return loss

    # ------------------------------------------------------------------------------------------ data order
    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is LengthGroupedSampler:
            shared = self.args.world_size > 1 and not self.accelerator.dispatch_batches  # (None: not for a Dataset)
            new = ResumableLengthGroupedSampler(sampler.batch_size, lengths=sampler.lengths, shared=shared)
            new.resume, self._sampler_resume = self._sampler_resume, None
            sampler = self._sampler = new
        return sampler

    def _run_epoch(self, *args, **kwargs):
        # accelerate's `DataLoaderShard.set_epoch` reaches a sampler at most two wrappers deep; after a mid-epoch
        # resume under DDP ours sits three deep (SkipBatchSampler > BatchSamplerShard > BatchSampler) and kept
        # epoch 0, so the resumed epoch was drawn afresh instead of from its saved state.
        if self._sampler is not None:
            self._sampler.set_epoch(kwargs["epoch"])
        return super()._run_epoch(*args, **kwargs)

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        self.diverged = None
        if resume_from_checkpoint is True:  # Trainer's "the last one": the newest complete one

            resume_from_checkpoint = newest_complete_checkpoint(self.args.output_dir)[0]
            if resume_from_checkpoint is None:
                raise ValueError(f"no complete checkpoint to resume from in {self.args.output_dir}")
        if isinstance(resume_from_checkpoint, str):
            path = os.path.join(resume_from_checkpoint, SAMPLER_STATE)
            if os.path.isfile(path):
                self._sampler_resume = torch.load(path, weights_only=True)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # ------------------------------------------------------------------------------------------ checkpoints
    def _get_output_dir(self, trial) -> str:
        return self._checkpoint_tmp_root or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        """Write ``checkpoint-N`` under ``.tmp-checkpoint/`` and rename it into place when complete."""
        run_dir = super()._get_output_dir(trial)
        name = f"checkpoint-{self.state.global_step}"
        tmp_root = os.path.join(run_dir, TMP_DIR)
        tmp, final = os.path.join(tmp_root, name), os.path.join(run_dir, name)
        if self.args.should_save and os.path.isdir(tmp):
            shutil.rmtree(tmp)  # left by a save that was killed
        self.accelerator.wait_for_everyone()
        self._checkpoint_tmp_root = tmp_root
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._checkpoint_tmp_root = None
        if self.state.best_model_checkpoint and self.state.best_model_checkpoint.startswith(tmp_root):
            self.state.best_model_checkpoint = os.path.join(run_dir, os.path.basename(self.state.best_model_checkpoint))
        if self.args.should_save:
            self._save_extras(tmp)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            if os.path.isdir(final):
                shutil.rmtree(final)
            os.replace(tmp, final)
            shutil.rmtree(tmp_root, ignore_errors=True)
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True)
        self.accelerator.wait_for_everyone()

    def _save_extras(self, ckpt: str) -> None:
        """Files of hf-attn's own written into the checkpoint before it becomes visible."""
        if self._sampler is not None and self._sampler.drawn is not None:
            torch.save(self._sampler.drawn, os.path.join(ckpt, SAMPLER_STATE))
        for cb in self.callback_handler.callbacks:
            if hasattr(cb, "write_checkpoint_files"):
                cb.write_checkpoint_files(ckpt, self.state)


def _any_process(flag: bool) -> bool:
    """``flag`` or-ed over the processes of a DDP run (each process sees only its own loss)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = torch.tensor([1.0 if flag else 0.0])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item() > 0)
    return flag


class _StopOnDivergence(TrainerCallback):
    """Stop at the first step with a non-finite loss, without saving or evaluating that step's weights."""

    def __init__(self, trainer: HfAttnSeq2SeqTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if _any_process(self.trainer.diverged is not None):
            if self.trainer.diverged is None:
                self.trainer.diverged = (state.global_step, float("nan"))
            control.should_training_stop = True
            control.should_save = control.should_evaluate = False


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
        if _any_process(self.elapsed() >= self.budget):
            control.should_training_stop = True
            control.should_save = True
        self._describe()

    def _describe(self):
        if self.trainer is None or self.budget is None:
            return
        for cb in self.trainer.callback_handler.callbacks:
            if isinstance(cb, ProgressCallback) and getattr(cb, "training_bar", None) is not None:
                cb.training_bar.set_description(f"{self.elapsed() / 60:.1f}/{self.budget / 60:.1f} min")

    def write_checkpoint_files(self, ckpt: str, state) -> None:
        """Called by `HfAttnSeq2SeqTrainer` on the main process while the checkpoint is still being written."""
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


class FirstSignal:
    """While installed (main thread only), SIGTERM / SIGINT / SIGUSR1 are recorded instead of acted on: ``name`` and
    ``signum`` of the first one; later ones change nothing. `restore` puts the previous handlers back."""

    def __init__(self):
        self.name: str | None = None
        self.signum: int | None = None
        self._previous: dict = {}

    def install(self) -> "FirstSignal":
        if threading.current_thread() is threading.main_thread():
            for name in PREEMPTION_SIGNALS:
                if hasattr(signal, name):  # (SIGUSR1 is POSIX only)
                    self._previous[name] = signal.signal(getattr(signal, name), self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.name is None:
            self.name, self.signum = signal.Signals(signum).name, signum

    def restore(self) -> None:
        for name, handler in self._previous.items():
            signal.signal(getattr(signal, name), handler)
        self._previous = {}


class StopOnSignalCallback(TrainerCallback):
    """Preemption: on SIGTERM, SIGINT or SIGUSR1 finish the current optimiser step, save a complete checkpoint of
    it (the atomic path of the periodic saves) and stop training; ``signal_name`` is then the signal's name.

    Clusters end jobs this way: SLURM, Kubernetes and spot instances send SIGTERM (SLURM can send SIGUSR1 ahead of
    time, ``--signal=USR1@120``), wait, then kill. The handlers (`FirstSignal`) are installed for the duration of
    ``train()`` and only record the first signal, so a second one during the save changes nothing. Under DDP the
    processes agree (all-reduce MAX) and stop at the same step. `HfAttnSeq2SeqTrainer` does not add it: add it to
    your own trainer with ``trainer.add_callback(StopOnSignalCallback())`` and check ``signal_name`` after
    ``trainer.train()`` returns (`hf-attn train` does, and exits with code 75)."""

    def __init__(self):
        self.signal_name: str | None = None  # the signal that stopped training
        self.received = FirstSignal()  # the first signal seen (this process)

    def on_train_begin(self, args, state, control, **kwargs):
        self.received.install()

    def on_step_end(self, args, state, control, **kwargs):
        if _any_process(self.received.name is not None):
            self.signal_name = self.received.name or "a signal to another process"
            control.should_training_stop = True
            control.should_save = True

    def on_train_end(self, args, state, control, **kwargs):
        if not self.signal_name:  # stopping: further signals stay recorded only, until the caller exits
            self.received.restore()


class InterruptAfterSteps(TrainerCallback):
    """Raise KeyboardInterrupt after ``steps`` optimiser steps (tests use it to interrupt a run)."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.steps:
            raise KeyboardInterrupt(f"interrupted after step {state.global_step}")
