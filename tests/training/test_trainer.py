"""Training glue: auxiliary loss with and without label smoothing, gradient accumulation, aux logs,
the training-step hook, the time budget, and the metrics (sacrebleu and the shipped `evaluate` modules)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from tiny_trainer import Tok, data, make_trainer, targs, tiny

from hf_attn.data import make_collator
from hf_attn.training import Seq2SeqMetrics, TimeBudgetCallback, score_translations


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


def test_gradient_accumulation_does_not_scale_the_loss(tmp_path):
    logged = {}
    for ga, bs in ((1, 8), (2, 4)):
        t = make_trainer(tmp_path / f"ga{ga}", max_steps=1, gradient_accumulation_steps=ga,
                         per_device_train_batch_size=bs, label_smoothing_factor=0.1, learning_rate=0.0)
        t.train()
        logged[ga] = [h["loss"] for h in t.state.log_history if "loss" in h][0]
    # equal-length examples: the mean over two micro-batches equals the full-batch mean (no x2 from trap 7)
    assert logged[2] == pytest.approx(logged[1], rel=1e-3)


def test_aux_logs_and_training_step_hook(tmp_path):
    t = make_trainer(tmp_path, max_steps=3, label_smoothing_factor=0.1)
    t.train()
    logs = [h for h in t.state.log_history if "loss" in h]
    assert len(logs) == 3
    assert all(h["mean_mask"] == pytest.approx(0.25) and h["reg_loss"] > 0 and "aux_loss" in h for h in logs)
    assert t.model.steps_seen == [0, 1, 2]
    assert t.train_target_tokens == 3 * 8 * 7


def test_training_step_callback_drives_the_schedule_under_a_stock_trainer(tmp_path):
    """The schedule hook is a TrainerCallback: a stock Seq2SeqTrainer with it drives `set_training_step` too."""
    from transformers import Seq2SeqTrainer

    from hf_attn.training import TrainingStepCallback

    model = tiny()
    t = Seq2SeqTrainer(model=model, args=targs(tmp_path, max_steps=3), train_dataset=data(),
                       data_collator=make_collator(Tok(), model), callbacks=[TrainingStepCallback()])
    t.train()
    assert model.steps_seen == [0, 1, 2]


def test_time_budget_stops_training(tmp_path):
    budget = TimeBudgetCallback(minutes=1e-6)
    t = make_trainer(tmp_path, max_steps=50)
    t.add_callback(budget)
    t.train()
    assert t.state.global_step == 1
    assert TimeBudgetCallback.elapsed_in(str(tmp_path / "checkpoint-1")) > 0  # saved for --resume
    assert TimeBudgetCallback(None).budget is None
    assert TimeBudgetCallback.elapsed_in(str(tmp_path / "missing")) == 0.0


def test_scores_and_signature():
    refs = ["The cat sat on the mat.", "In the beginning God created the heavens and the earth."]
    s = score_translations(refs, refs)
    assert s["bleu"] == 100.0 and s["chrf"] == 100.0
    assert s["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "nc:6|nw:0" in s["chrf_signature"]
    low = score_translations(["a dog", "nothing here"], refs)
    assert 0 <= low["bleu"] < 10 and low["chrf"] < 30
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(refs, refs[:1])


def test_compute_metrics_decodes_with_ignored_labels():
    from types import SimpleNamespace

    import numpy as np

    class DecTok:
        pad_token_id = 0
        words = {1: "the", 2: "cat", 3: "sat", 4: "on", 5: "a", 6: "mat"}

        def batch_decode(self, rows, skip_special_tokens=True):
            return [" ".join(self.words[int(i)] for i in r if int(i) in self.words) for r in rows]

    m = Seq2SeqMetrics(DecTok())
    preds = np.array([[1, 2, 3, 4, 5, 6, 0], [1, 2, 3, 4, 1, 0, 0]])
    labels = np.array([[1, 2, 3, 4, 5, 6, -100], [1, 2, 3, 4, 1, -100, -100]])
    out = m(SimpleNamespace(predictions=preds, label_ids=labels))
    assert out["bleu"] == 100.0 and out["gen_len"] == 5.5 and m.signatures["bleu"].startswith("nrefs:1")


def test_evaluate_metric_modules_load_offline():
    from hf_attn.metrics import load_metric

    bleu = load_metric("sacrebleu")
    r = bleu.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on a mat"]])
    direct = score_translations(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert math.isclose(r["score"], direct["bleu"], abs_tol=0.01) and r["signature"] == direct["bleu_signature"]
    chrf = load_metric("chrf")
    r = chrf.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on a mat"]])
    assert math.isclose(r["score"], direct["chrf"], abs_tol=0.01)


def test_softmax_reference_comes_from_a_matching_reproduce_record(monkeypatch, tmp_path):
    import json

    from hf_attn.training import reference
    from hf_attn.training.record import summary_line

    common = {"test_sentences": 879, "train_steps": 300, "minutes": None, "default_model_size": True, "init_from": None,
              "data": {"corpus": "bible", "source_code": "e", "target_code": "4"},
              "training": {"learning_rate": 1e-3, "warmup_steps": 300, "embedding_init_std": 0.0625, "seed": 42},
              "model_config": {"scale_embedding": True, "activation_function": "relu"}}
    record = {"name": "de-en_300steps_seed42_softmax", "status": "complete",
              "results": {**common, "preset": "softmax", "bleu": 5.0, "chrf": 20.0, "device": "2-core CPU"}}
    (tmp_path / "de-en_300steps_seed42_softmax.json").write_text(json.dumps(record))
    (tmp_path / "failed.json").write_text(json.dumps({**record, "status": "failed"}))
    monkeypatch.setattr(reference, "RECORD_DIRS", [tmp_path])
    run = {**common, "preset": "rela-g", "bleu": 6.0, "chrf": 21.0, "source_lang": "de", "target_lang": "en",
           "num_beams": 4, "train_minutes": 14.0, "tokens_per_second": 900, "bleu_signature": "sig"}
    ref = reference.reference_for(run)
    assert ref == {"bleu": 5.0, "chrf": 20.0, "steps": 300, "device": "2-core CPU", "seed": 42,
                   "record": "de-en_300steps_seed42_softmax"}
    run["reference"] = ref
    assert "| softmax reference: BLEU 5.0 / chrF 20.0 (300 steps on 2-core CPU) |" in summary_line(run)
    for change in ({"train_steps": 299}, {"minutes": 15.0}, {"default_model_size": False}, {"test_sentences": 100},
                   {"training": {**common["training"], "learning_rate": 5e-4}},
                   {"model_config": {"scale_embedding": False, "activation_function": "relu"}},
                   {"model_config": {"scale_embedding": True, "activation_function": "swish"}},
                   {"training": {**common["training"], "embedding_init_std": 0.02}},
                   {"data": {"corpus": "bible", "source_code": "s", "target_code": "4"}}):
        assert reference.reference_for({**run, **change}) is None, change


FAULTS_PER_STEP = """
import resource, sys, torch
from hf_attn.bench.memory import keep_freed_memory
print(keep_freed_memory())
for _ in range(2):  # a training step's large tensors: allocated, written, freed
    torch.ones(16 * 2**20).sum()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    torch.ones(16 * 2**20).sum()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_cpu_training_reuses_freed_memory_without_page_faults():
    """64 MB blocks (above glibc's mmap threshold) freed and allocated again: with `keep_freed_memory` the pages are
    reused; with HF_ATTN_MALLOC=system each block is 16,384 fresh pages from the kernel."""
    def faults(**env):
        out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1", **env}).stdout.split()
        return out[0] == "True", int(out[1])

    applied, kept = faults()
    system, fresh = faults(HF_ATTN_MALLOC="system")
    assert applied and not system
    assert kept < 500 and fresh > 5 * 16_000, (kept, fresh)


BIG_PARENT = """
import subprocess, sys
big = bytearray(2 * 2**30)  # 2 GiB, every page touched: the parent's RSS
child = "import resource; from hf_attn.bench.memory import peak_rss_mib; " \\
        "print(peak_rss_mib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status")
def test_peak_rss_of_a_child_is_its_own_not_its_parents():
    """results.json's peak_rss_mib in a child of `hf-attn reproduce`: ru_maxrss would carry the parent's 2 GiB
    across fork and exec; VmHWM is the child's own peak."""
    out = subprocess.run([sys.executable, "-c", BIG_PARENT], capture_output=True, text=True, check=True).stdout
    peak, maxrss = map(int, out.split())
    assert maxrss >= 2048 and 0 < peak < 1500, (peak, maxrss)
