"""Attention calibration (Lu et al. 2021): gradient separation of the two objectives in one loss, padding,
the anneal schedule driven by the trainer and saved with the model, saliency maps, config errors, numerics, and
two-process DDP training with `accelerate launch`."""

from __future__ import annotations

import json
import math
import socket
import subprocess

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_batch, tiny_model
from datasets import Dataset
import tiny_trainer
from training_helpers import REPO, TINY_ARGS, accelerate_cli, offline_env
from transformers import Seq2SeqTrainingArguments

import hf_attn
from hf_attn.analysis.calibration import calibration_maps, plot_saliency, saliency_map
from hf_attn.modeling import attention_calibration as calib
from hf_attn.modeling.hyperparameters import HfAttnConfigError

PRESETS = ("calibration-fixed", "calibration-anneal", "calibration-gate")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: torch on one thread


def split_parameters(model):
    """(theta, phi): [(name, parameter)] of the NMT model and of the mask-perturbation models."""
    phi_ids = {id(p) for m in calib.calibrated_modules(model) for p in m.phi_parameters()}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [(n, p) for n, p in named if id(p) not in phi_ids], [(n, p) for n, p in named if id(p) in phi_ids]


def nmt_loss(out, labels):
    return F.cross_entropy(out.logits.view(-1, out.logits.shape[-1]), labels.view(-1), ignore_index=-100)


def is_zero(g):
    return g is None or bool((g == 0).all())


# ---------------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_each_objective_reaches_only_its_own_parameters(base):
    model = tiny_model(base, "calibration-gate").train()
    batch = tiny_batch()
    theta, phi = split_parameters(model)
    assert len(phi) == 4 * model.config.decoder_layers  # W_q, b_q, W_k, b_k per layer
    out = model(**batch)
    l_nmt = nmt_loss(out, batch["labels"])
    assert out.aux_loss.item() == 0.0 and torch.allclose(out.loss, l_nmt)  # the bracket has value 0
    # perturbation objective: zero gradient on every NMT parameter, a gradient on every phi parameter
    g_theta = torch.autograd.grad(out.aux_loss, [p for _, p in theta], retain_graph=True, allow_unused=True)
    assert all(is_zero(g) for g in g_theta), [n for (n, _), g in zip(theta, g_theta) if not is_zero(g)]
    g_phi = torch.autograd.grad(out.aux_loss, [p for _, p in phi], retain_graph=True)
    assert all(g.abs().sum() > 0 for g in g_phi)
    # translation objective: zero gradient on every phi parameter, a gradient on the gate and the decoder
    g_phi = torch.autograd.grad(l_nmt, [p for _, p in phi], retain_graph=True, allow_unused=True)
    assert all(is_zero(g) for g in g_phi)
    g_theta = dict(zip([n for n, _ in theta], torch.autograd.grad(l_nmt, [p for _, p in theta], allow_unused=True)))
    assert not is_zero(g_theta["model.decoder.layers.0.encoder_attn.calibration_gate.weight"])
    assert not is_zero(g_theta["model.decoder.layers.0.self_attn.q_proj.weight"])


def single_loss_grads(model, batch):
    model.zero_grad()
    model(**batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def released_recipe_grads(model, batch, monkeypatch):
    """The released code's recipe: one graph without any cut, two backward passes with requires_grad toggling
    (phi frozen for L_nmt, theta frozen for L_phi)."""
    theta, phi = split_parameters(model)
    grads = {}
    with monkeypatch.context() as mp:
        mp.setattr(calib, "_cut", lambda t: t)
        for frozen, trained, loss_of in ((phi, theta, "nmt"), (theta, phi, "phi")):
            model.zero_grad()
            for _, p in frozen:
                p.requires_grad_(False)
            out = model(**batch)
            (nmt_loss(out, batch["labels"]) if loss_of == "nmt" else out.aux_loss).backward()
            for _, p in frozen:
                p.requires_grad_(True)
            grads.update({n: p.grad.clone() for n, p in trained if p.grad is not None})
    return grads


@pytest.mark.parametrize("preset", ["calibration-gate", "calibration-fixed"])
def test_single_loss_equals_the_two_backward_recipe(preset, monkeypatch):
    """Same gradients as the released code: L_nmt also reaches theta through the masks (decoder and encoder
    states), and CE_p reaches phi through the activations of every perturbed layer."""
    model = tiny_model("marian", preset, decoder_layers=3).train()
    batch = tiny_batch()
    ours = single_loss_grads(model, batch)
    ref = released_recipe_grads(model, batch, monkeypatch)
    assert set(ours) == set(ref)
    for n in ref:
        torch.testing.assert_close(ours[n], ref[n], rtol=1e-5, atol=1e-7, msg=n)

    # negative controls: cutting the activation paths changes the gradients, so the comparison above sees them
    original = calib.CalibratedAttention.perturbation_mask

    def states_cut(self, x, enc, real, view, ctx=None):
        return original(self, x.detach(), enc.detach(), real, view, ctx)

    monkeypatch.setattr(calib.CalibratedAttention, "perturbation_mask", states_cut)
    cut = single_loss_grads(model, batch)
    assert not torch.allclose(cut["model.decoder.layers.0.self_attn.q_proj.weight"],
                              ref["model.decoder.layers.0.self_attn.q_proj.weight"], rtol=1e-4, atol=0)  # L_nmt via m
    assert not torch.allclose(cut["model.decoder.layers.0.encoder_attn.perturb_q_proj.weight"],
                              ref["model.decoder.layers.0.encoder_attn.perturb_q_proj.weight"], rtol=1e-4, atol=0)  # CE_p up


# ---------------------------------------------------------------------------------------------------- padding
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_mask_and_perturbed_weights_are_zero_on_padding(base):
    model = tiny_model(base, "calibration-gate").train()
    batch = tiny_batch()
    pad = ~batch["attention_mask"].bool()
    assert pad.any()
    details = model(**batch, output_attention_details=True).attention_details  # training: both passes' maps
    real = (~pad)[:, None, None, :].float()
    for layer in range(model.config.decoder_layers):
        rec = details[f"cross.{layer}"]
        for key in ("mask", "calibrated", "combined", "perturbed", "perturbed_mask", "perturbed_attention"):
            assert (rec[key] * (1 - real)).abs().max() == 0, key
        mask = rec["mask"]
        assert ((mask > 0) & (mask < 1)).float().mul(real).sum() == real.expand_as(mask).sum()
        # Eq. 3: the removed mass goes uniformly to the J real source tokens (released code: also to padding)
        pm, pa = rec["perturbed_mask"], rec["perturbed_attention"]
        expected = pm * pa + (1 - pm) * real / real.sum(-1, keepdim=True)
        torch.testing.assert_close(rec["perturbed"], expected)
        total = rec["perturbed"].sum(-1)
        torch.testing.assert_close(total, (pm * pa).sum(-1) + ((1 - pm) * real).sum(-1) / real.sum(-1))


def test_fused_weights_follow_each_fusion():
    batch = tiny_batch()
    for fusion, extra in (("fixed", {}), ("fixed_softmax", {}), ("anneal", {}), ("gate", {"calibration_gate_per_head": True})):
        model = tiny_model("marian", "calibration-gate", calibration_fusion=fusion, **extra)
        model.set_training_step(30000)
        recs = calibration_maps(model, batch["input_ids"], batch["attention_mask"], labels=batch["labels"])
        for rec in recs.values():
            a, a_c = rec["attention"], rec["calibrated"]
            torch.testing.assert_close(a_c, a * torch.exp(1 - rec["mask"]))  # Eq. 7
            expected = {
                "fixed": a + 0.1 * a_c,
                "fixed_softmax": None,
                "anneal": math.exp(-0.3) * a + (1 - math.exp(-0.3)) * a_c,
                "gate": None if "gate" not in rec else rec["gate"][..., None] * a + (1 - rec["gate"][..., None]) * a_c,
            }[fusion]
            if fusion == "fixed_softmax":  # Eq. 8 as printed: a distribution over the real tokens
                sums = rec["combined"].sum(-1)
                torch.testing.assert_close(sums, torch.ones_like(sums))
            else:
                torch.testing.assert_close(rec["combined"], expected)


# ---------------------------------------------------------------------------------------------------- anneal
def test_anneal_step_is_saved_and_loaded(tmp_path):
    model = tiny_model("marian", "calibration-anneal")
    batch = tiny_batch()
    with torch.no_grad():
        start = model(**batch).logits
        model.set_training_step(70000)
        later = model(**batch).logits
    assert not torch.allclose(start, later)
    assert [m.calibration_step.item() for m in calib.calibrated_modules(model)] == [70000, 70000]
    model.save_pretrained(tmp_path)
    loaded = hf_attn.HfAttnMarianMTModel.from_pretrained(tmp_path).eval()
    assert [m.calibration_step.item() for m in calib.calibrated_modules(loaded)] == [70000, 70000]
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, later, rtol=0, atol=1e-6)
    assert calib.calibrated_modules(loaded)[0].calibration_step.dtype == torch.long
    loaded.half()  # an int64 step survives a dtype cast exactly
    assert calib.calibrated_modules(loaded)[0].calibration_step.item() == 70000


class Tok(tiny_trainer.Tok):
    """The tiny trainer's tokenizer stand-in, with the pad id of `tiny_model`'s config."""

    pad_token_id = 1


@pytest.mark.slow
def test_trainer_drives_the_schedule_and_logs_the_objectives(tmp_path):
    from hf_attn.data import make_collator
    from hf_attn.training import HfAttnSeq2SeqTrainer

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(16):
        n, k = 4 + i % 5, 3 + i % 4
        rows.append({"input_ids": torch.randint(3, 64, (n,), generator=g).tolist() + [2],
                     "labels": torch.randint(3, 64, (k,), generator=g).tolist() + [2]})
    model = tiny_model("marian", "calibration-anneal").train()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-3, max_steps=3, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, label_smoothing_factor=0.1, use_cpu=True,
        dataloader_pin_memory=False, gradient_accumulation_steps=2)
    trainer = HfAttnSeq2SeqTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                   data_collator=make_collator(Tok(), model))
    trainer.train()
    assert [m.calibration_step.item() for m in calib.calibrated_modules(model)] == [2, 2]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 3
    for h in logs:
        for key in ("translation_loss", "perturbed_loss", "mean_mask", "mask_penalty", "calibration_anneal_ratio"):
            assert key in h and math.isfinite(h[key]), (key, h)
        assert 0 < h["mean_mask"] < 1
    assert logs[-1]["calibration_anneal_ratio"] == pytest.approx(math.exp(-2 / 1e5))


# ---------------------------------------------------------------------------------------------------- saliency
def test_saliency_map_and_plot(tmp_path):
    class PairTok:
        def __call__(self, source, text_target, return_tensors="pt"):
            src = [3 + len(w) * 7 % 50 for w in source.split()] + [2]
            tgt = [3 + len(w) * 5 % 50 for w in text_target.split()] + [2]
            return {"input_ids": torch.tensor([src]), "attention_mask": torch.ones(1, len(src), dtype=torch.long),
                    "labels": torch.tensor([tgt])}

        def convert_ids_to_tokens(self, ids):
            return [f"t{i}" for i in ids]

    model = tiny_model("marian", "calibration-gate", decoder_layers=3)
    sal = saliency_map(model, PairTok(), "im Anfang war das Wort", "in the beginning")
    assert sal["layers"] == [0, 1, 2]
    assert sal["mask"].shape == (3, 4, 4, 6) and sal["gate"].shape == (3, 4, 4)
    assert len(sal["source_tokens"]) == 6 and len(sal["target_tokens"]) == 4
    assert ((sal["mask"] > 0) & (sal["mask"] < 1)).all()
    path = plot_saliency(sal, tmp_path / "saliency.png", layer=-1)
    assert path.stat().st_size > 1000
    plot_saliency(sal, tmp_path / "head.png", layer=0, head=1, values="combined")
    with pytest.raises(ValueError, match="values="):
        plot_saliency(sal, tmp_path / "x.png", values="nope")
    with pytest.raises(ValueError, match="no calibrated cross-attention"):
        saliency_map(tiny_model("marian", "softmax"), PairTok(), "a", "b")


# ---------------------------------------------------------------------------------------------------- config, numerics
@pytest.mark.parametrize(
    "key,value,match",
    [("calibration_fusion", "sum", "calibration_fusion='sum' is not valid"),
     ("calibration_alpha", -1.0, "calibration_alpha=-1.0 must be a finite number >= 0"),
     ("calibration_anneal_steps", 0, "calibration_anneal_steps=0 must be a finite number > 0"),
     ("calibration_label_smoothing", 1.0, "calibration_label_smoothing=1.0 must be in"),
     ("calibration_gate_per_head", "yes", "calibration_gate_per_head='yes' must be true or false")],
)
def test_config_errors(key, value, match):
    with pytest.raises(HfAttnConfigError, match=match):
        hf_attn.HfAttnMarianConfig.from_preset("calibration-gate", **{key: value})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_one_token_sources_stay_finite(dtype):
    model = tiny_model("bart", "calibration-gate").train()
    batch = tiny_batch()
    batch["attention_mask"][2] = 0
    batch["attention_mask"][2, 0] = 1  # a one-token source
    with torch.autocast("cpu", dtype=dtype):
        out = model(**batch)
    assert torch.isfinite(out.loss) and all(torch.isfinite(v) for v in out.aux_logs.values())
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_eval_mode_has_no_perturbed_pass():
    model = tiny_model("marian", "calibration-gate")
    with torch.no_grad():
        out = model(**tiny_batch())
    assert out.aux_loss is None and not out.aux_logs


# ---------------------------------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_accelerate_training(tmp_path):
    out_dir = tmp_path / "run"
    # two DDP processes (gloo) on a CPU-only machine: the multi-process launcher plus ACCELERATE_USE_CPU
    cmd = accelerate_cli("train", "--preset", "calibration-gate", *TINY_ARGS, "--max_steps", "4",
                         "--cache_dir", str(tmp_path / "cache"), "--output_dir", str(out_dir), port=str(_free_port()))
    proc = subprocess.run(cmd, check=False, cwd=REPO, env=offline_env(ACCELERATE_USE_CPU="true"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "2 process(es)" in proc.stdout, proc.stdout[-2000:]
    r = json.loads((out_dir / "results.json").read_text())
    assert r["world_size"] == 2 and r["train_steps"] == 4
    for key in ("translation_loss", "perturbed_loss", "mean_mask", "calibration_gate"):
        assert math.isfinite(r["aux_logs"][key]), key
    loaded = hf_attn.HfAttnMarianMTModel.from_pretrained(out_dir)
    assert len(calib.calibrated_modules(loaded)) == 1


def test_train_scales_the_anneal_timescale_to_the_step_budget():
    """T = 1e5 is the paper's for 150k steps; `hf-attn train` keeps its end ratio exp(-1.5) for a step budget."""
    import math

    from hf_attn.training.build import scaled_anneal

    assert scaled_anneal("calibration-anneal", 600, {}) == {"calibration_anneal_steps": 400.0}
    assert math.exp(-600 / 400.0) == pytest.approx(math.exp(-150_000 / 1e5))
    assert scaled_anneal("calibration-anneal", 600, {"calibration_anneal_steps": 5.0}) == {}  # the user's value wins
    assert scaled_anneal("calibration-gate", 600, {}) == {}
    assert scaled_anneal("calibration-gate", 600, {"calibration_fusion": "anneal"}) == {"calibration_anneal_steps": 400.0}
    assert scaled_anneal("calibration-anneal", -1, {}) == {}  # a wall-clock budget: no step count to scale to
