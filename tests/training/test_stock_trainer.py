"""hf-attn models under transformers' own `Seq2SeqTrainer`: the same gradients as `HfAttnSeq2SeqTrainer` where
that can be done transparently, one clear error at the first step where it cannot (never a silent difference)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_model
from tiny_trainer import Tok, data, targs
from transformers import Seq2SeqTrainer, TrainerCallback

from hf_attn.data import make_collator
from hf_attn.modeling import HfAttnConfigError
from hf_attn.training import HfAttnSeq2SeqTrainer, TrainingStepCallback

PRESETS = ("reluformer", "calibration-gate", "calibration-anneal")


class GradSnapshot(TrainerCallback):
    """The accumulated gradients just before the first optimizer step."""

    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def first_step_grads(trainer_cls, model, tmp_path, callbacks=(), **kw):
    snap = GradSnapshot()
    args = targs(tmp_path, max_steps=1, per_device_train_batch_size=4, learning_rate=0.0, **kw)
    trainer = trainer_cls(model=model, args=args, train_dataset=data(n=8, length=5),
                          data_collator=make_collator(Tok(), model), callbacks=[snap, *callbacks])
    trainer.train()
    return snap.grads


def model_for(preset):
    # the training-data ids of test_training (pad 39, eos 0) in a tiny hf-attn model
    return tiny_model("marian", preset, vocab_size=40, pad_token_id=39, decoder_start_token_id=39, eos_token_id=0,
                      forced_eos_token_id=0).train()


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("accumulation", [1, 2])
def test_stock_trainer_gets_the_same_gradients(preset, accumulation, tmp_path):
    model = model_for(preset)
    ours = first_step_grads(HfAttnSeq2SeqTrainer, copy.deepcopy(model), tmp_path / "ours",
                            gradient_accumulation_steps=accumulation)
    stock = first_step_grads(Seq2SeqTrainer, copy.deepcopy(model), tmp_path / "stock", [TrainingStepCallback()],
                             gradient_accumulation_steps=accumulation)
    assert set(ours) == set(stock) and ours
    for name in ours:
        torch.testing.assert_close(stock[name], ours[name], rtol=1e-5, atol=1e-7, msg=name)
    if preset.startswith("calibration"):  # the mask network is trained (its objective reached the optimiser)
        assert any(n.endswith("perturb_q_proj.weight") and ours[n].abs().sum() > 0 for n in ours)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_stock_trainer_with_label_smoothing_fails_at_the_first_step(preset, tmp_path):
    """Transformers' trainer drops `labels` to smooth them itself and never sees `aux_loss`: a loud error, not
    a run without the variant's objective. HfAttnSeq2SeqTrainer trains the same setup."""
    with pytest.raises(HfAttnConfigError, match="needs `labels` in every training forward") as err:
        first_step_grads(Seq2SeqTrainer, model_for(preset), tmp_path / "stock", [TrainingStepCallback()],
                         label_smoothing_factor=0.1)
    # the fixes a script user can apply, naming the preset (not the internal variant)
    assert f"preset {preset!r}" in str(err.value) and "--label_smoothing_factor 0" in str(err.value)
    grads = first_step_grads(HfAttnSeq2SeqTrainer, model_for(preset), tmp_path / "ours", label_smoothing_factor=0.1)
    assert grads


@pytest.mark.slow
def test_a_step_driven_schedule_without_the_step_hook_fails_at_the_first_step(tmp_path):
    with pytest.raises(HfAttnConfigError, match="set_training_step was never called"):
        first_step_grads(Seq2SeqTrainer, model_for("calibration-anneal"), tmp_path)
