"""The recipe controls of `hf-attn train`: layer init, the Noam peak, checkpoint averaging, GMM's gate init, and
what a run records of them (results.json, model card)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config, tiny_model
from training_helpers import TINY_ARGS, cli_in_process

from hf_attn.errors import HfAttnInputError
from hf_attn.training.checkpoints import average_last_checkpoints
from hf_attn.training.build import apply_noam, init_layers, noam_learning_rate


def test_xavier_init_touches_the_layers_projections_only():
    model = tiny_model("marian", "gmm", init_std=0.5)  # a std no xavier bound comes near
    gmm_ffn = model.model.decoder.layers[0].encoder_attn.gmm_mean.hidden.weight.clone()
    embeddings = model.get_input_embeddings().weight.clone()
    n = init_layers(model, "xavier")
    layer = model.model.decoder.layers[0]
    assert n == len(model.model.encoder.layers) * 6 + len(model.model.decoder.layers) * 10
    for lin, gain in ((layer.self_attn.q_proj, 2 ** -0.5), (layer.encoder_attn.out_proj, 1.0), (layer.fc1, 1.0)):
        fan_out, fan_in = lin.weight.shape
        bound = gain * math.sqrt(6 / (fan_in + fan_out))
        assert lin.weight.abs().max() <= bound and lin.weight.abs().max() > 0.8 * bound
        assert torch.count_nonzero(lin.bias) == 0
    assert torch.equal(layer.encoder_attn.gmm_mean.hidden.weight, gmm_ffn)  # the variant's own init stays
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    assert init_layers(model, "marian") == 0


def test_noam_peak_and_its_flags():
    assert noam_learning_rate(1.0, 512, 4000) == pytest.approx(6.99e-4, rel=1e-3)  # the ReLA authors' peak
    targs = SimpleNamespace(lr_scheduler_type="inverse_sqrt", warmup_steps=400, learning_rate=1e-3)
    apply_noam(SimpleNamespace(noam_factor=2.0), targs, 256, given=set())
    assert targs.learning_rate == pytest.approx(2.0 * (256 * 400) ** -0.5)
    with pytest.raises(HfAttnInputError, match="drop --learning_rate"):
        apply_noam(SimpleNamespace(noam_factor=1.0), targs, 256, given={"learning_rate"})
    with pytest.raises(HfAttnInputError, match="inverse_sqrt"):
        apply_noam(SimpleNamespace(noam_factor=1.0), SimpleNamespace(lr_scheduler_type="linear", warmup_steps=4), 256, set())
    with pytest.raises(HfAttnInputError, match="warmup_steps"):
        apply_noam(SimpleNamespace(noam_factor=1.0), SimpleNamespace(lr_scheduler_type="inverse_sqrt", warmup_steps=0),
                   256, set())


def _checkpoint(root, step, model):
    d = root / f"checkpoint-{step}"
    model.save_pretrained(d)
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


@pytest.mark.parametrize("final_saved", [True, False])
def test_averaging_the_last_checkpoints(tmp_path, final_saved):
    models = [tiny_model("marian", "rela-g", seed=s) for s in range(4)]
    for step, m in zip((1, 2, 3), models):
        _checkpoint(tmp_path, step, m)
    (tmp_path / "checkpoint-9").mkdir()  # incomplete: skipped
    final = models[2] if final_saved else models[3]
    names = average_last_checkpoints(final, tmp_path, 2, final_step=3 if final_saved else 4)
    assert names == (["checkpoint-2", "checkpoint-3"] if final_saved else ["checkpoint-3", "final"])
    pair = (models[1], tiny_model("marian", "rela-g", seed=2)) if final_saved else (tiny_model("marian", "rela-g", seed=2),
                                                                                       tiny_model("marian", "rela-g", seed=3))
    for name, p in final.named_parameters():
        want = (dict(pair[0].named_parameters())[name] + dict(pair[1].named_parameters())[name]) / 2
        torch.testing.assert_close(p, want, msg=name)
    assert final.get_output_embeddings().weight.data_ptr() == final.get_input_embeddings().weight.data_ptr()


def test_gmm_gate_starts_at_its_init():
    for g0 in (0.1, 0.5, 0.9):
        gate = tiny_model("marian", "gmm", gmm_gate_init=g0).model.decoder.layers[0].encoder_attn.gmm_gate.out.bias
        assert torch.sigmoid(gate).item() == pytest.approx(g0)
    assert tiny_config("marian", "gmm").gmm_gate_init == 0.1


@pytest.mark.slow
def test_a_run_records_its_recipe(tmp_path, one_thread):
    from hf_attn.cli import main

    out = tmp_path / "run"
    tiny = [a for i, a in enumerate(TINY_ARGS) if "--learning_rate" not in TINY_ARGS[max(i - 1, 0):i + 1]]
    assert main(["train", "--preset", "gmm", *tiny, "--max_steps", "5", "--save_steps", "2", "--eval_steps", "2",
                 "--init_scheme", "xavier", "--max_grad_norm", "0", "--average_checkpoints", "3",
                 "--warmup_steps", "4", "--noam_factor", "2", "--length_penalty", "0.6", "--output_dir", str(out)]) == 0
    run = json.loads((out / "results.json").read_text())
    tr = run["training"]
    assert tr["init_scheme"] == "xavier" and tr["max_grad_norm"] == 0 and tr["noam_factor"] == 2
    assert tr["learning_rate"] == pytest.approx(2 * (32 * 4) ** -0.5)
    assert tr["averaged_checkpoints"] == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    assert run["length_penalty"] == 0.6
    assert any("the test split has 8 sentences" in w for w in run["warnings"])  # a tiny test split is named
    card = (out / "README.md").read_text()
    assert "| layer init | xavier_uniform" in card and "| checkpoint averaging | checkpoint-2, checkpoint-4" in card
    assert "length penalty 0.6" in card


def test_recipe_flag_misuse_is_one_line(tmp_path, capsys):
    code, err = cli_in_process(["train", *TINY_ARGS, "--average_checkpoints", "-1", "--output_dir",
                                str(tmp_path / "bad")], capsys)
    assert code == 2 and "--average_checkpoints -1 must be an integer >= 0" in err
    code, err = cli_in_process(["train", *TINY_ARGS, "--noam_factor", "1", "--output_dir", str(tmp_path / "both")],
                               capsys)
    assert code == 2 and "drop --learning_rate" in err and "tokeniz" not in err


def test_evaluation_warnings_name_what_makes_a_score_mean_little():
    from hf_attn.training.record import evaluation_warnings

    train = [f"train sentence {i}" for i in range(500)]
    test = [f"test sentence {i}" for i in range(200)]
    assert evaluation_warnings(train, test, ["a translation"] * 200) == []
    small = evaluation_warnings(train, test[:20], ["x"] * 20)
    assert len(small) == 1 and "20 sentences (under 100)" in small[0]
    leaked = evaluation_warnings(train, test[:150] + train[:50], ["x"] * 200)
    assert len(leaked) == 1 and "50 of the 200 test sources also occur in the training split" in leaked[0]
    empty = evaluation_warnings(train, test, [""] * 30 + ["x"] * 170)
    assert len(empty) == 1 and "30 of the 200 translations are empty" in empty[0]
