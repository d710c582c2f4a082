"""The trainer (`HfAttnSeq2SeqTrainer`): the auxiliary loss with and without label smoothing, gradient accumulation,
the auxiliary logs, the training-step hook (also under a stock `Seq2SeqTrainer`), and the time budget."""

from __future__ import annotations

import pytest
import torch
from tiny_trainer import Tok, data, make_trainer, targs, tiny

from hf_attn.data import make_collator
from hf_attn.training import TimeBudgetCallback


def _inputs(trainer, n=8):
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(n)])
    return {k: v for k, v in batch.items()}


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_aux_loss_is_trained_on(tmp_path, smoothing):
    trainer = make_trainer(tmp_path, label_smoothing_factor=smoothing)
    model = trainer.model
    inputs = _inputs(trainer)
    loss = trainer.compute_loss(model, dict(inputs))
    out = model(**inputs)
    aux = out.aux_loss
    logp = torch.log_softmax(out.logits, -1)
    labels = inputs["labels"]
    mask = labels != -100
    nll = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask].mean()
    smooth = -logp.mean(-1)[mask].mean()
    expected = (1 - smoothing) * nll + smoothing * smooth + aux
    assert aux.item() > 0.1
    assert torch.allclose(loss, expected, rtol=1e-4), (loss, expected)
    # the auxiliary term gets its gradient
    loss.backward()
    assert model.model.encoder.layers[0].fc1.weight.grad is not None


@pytest.mark.slow
def test_gradient_accumulation_does_not_scale_the_loss(tmp_path):
    logged = {}
    for ga, bs in ((1, 8), (2, 4)):
        t = make_trainer(tmp_path / f"ga{ga}", max_steps=1, gradient_accumulation_steps=ga,
                         per_device_train_batch_size=bs, label_smoothing_factor=0.1, learning_rate=0.0)
        t.train()
        logged[ga] = [h["loss"] for h in t.state.log_history if "loss" in h][0]
    # equal-length examples: the mean over two micro-batches equals the full-batch mean (no x2 from trap 7)
    assert logged[2] == pytest.approx(logged[1], rel=1e-3)


@pytest.mark.slow
def test_aux_logs_and_training_step_hook(tmp_path):
    t = make_trainer(tmp_path, max_steps=3, label_smoothing_factor=0.1)
    t.train()
    logs = [h for h in t.state.log_history if "loss" in h]
    assert len(logs) == 3
    assert all(h["mean_mask"] == pytest.approx(0.25) and h["reg_loss"] > 0 and "aux_loss" in h for h in logs)
    assert t.model.steps_seen == [0, 1, 2]
    assert t.train_target_tokens == 3 * 8 * 7


@pytest.mark.slow
def test_training_step_callback_drives_the_schedule_under_a_stock_trainer(tmp_path):
    """The schedule hook is a TrainerCallback: a stock Seq2SeqTrainer with it drives `set_training_step` too."""
    from transformers import Seq2SeqTrainer

    from hf_attn.training import TrainingStepCallback

    model = tiny()
    t = Seq2SeqTrainer(model=model, args=targs(tmp_path, max_steps=3), train_dataset=data(),
                       data_collator=make_collator(Tok(), model), callbacks=[TrainingStepCallback()])
    t.train()
    assert model.steps_seen == [0, 1, 2]


@pytest.mark.slow
def test_time_budget_stops_training(tmp_path):
    budget = TimeBudgetCallback(minutes=1e-6)
    t = make_trainer(tmp_path, max_steps=50)
    t.add_callback(budget)
    t.train()
    assert t.state.global_step == 1
    assert TimeBudgetCallback.elapsed_in(str(tmp_path / "checkpoint-1")) > 0  # saved for --resume
    assert TimeBudgetCallback(None).budget is None
    assert TimeBudgetCallback.elapsed_in(str(tmp_path / "missing")) == 0.0
