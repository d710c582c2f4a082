"""Habits of transformers users that the `hf-attn` command meets: `convert --output_dir`, a variant's flag the
preset would ignore (refused, as in `from_preset`), and a command line that parses without torch and transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from training_helpers import offline_env

from hf_attn.cli import main, snapshot
from hf_attn.modeling import HfAttnConfigError, HfAttnMarianConfig

HEAVY = ("torch", "transformers", "datasets", "tokenizers", "sentencepiece", "accelerate", "numpy", "hf_attn.modeling")


def one_error_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hf-attn: error:"), err
    for needle in needles:
        assert needle in err, err
    return err


# ---- convert --output_dir -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stock_marian(tmp_path_factory):
    from viewer_helpers import stock_model_dir

    root = tmp_path_factory.mktemp("stock")
    return stock_model_dir("marian", root / "stock-marian", root / "tokenizers")


@pytest.mark.parametrize("spelling", [["--output_dir", "{out}"], ["--output-dir", "{out}"], ["{out}"],
                                      ["{out}", "--output_dir", "{out}"]])
def test_convert_takes_output_dir_as_every_command_does(stock_marian, tmp_path, capsys, spelling):
    out = tmp_path / "converted"
    argv = ["convert", str(stock_marian), *[a.format(out=out) for a in spelling], "--preset", "rela-g"]
    assert main(argv) == 0
    assert json.loads((out / "config.json").read_text())["preset"] == "rela-g"
    assert f"converted {stock_marian} to rela-g" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    ([], "no output directory; give it after SOURCE or as --output_dir DIR"),
    (["{tmp}/a", "--output_dir", "{tmp}/b"], "two output directories"),
])
def test_convert_output_directory_errors(stock_marian, tmp_path, capsys, args, message):
    assert main(["convert", str(stock_marian), *[a.format(tmp=tmp_path) for a in args]]) == 2
    one_error_line(capsys, message)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- a variant's hyperparameter the preset does not use -----------------------------------------------------------
def test_train_refuses_a_flag_of_a_variant_the_preset_does_not_use(tmp_path, capsys):
    assert main(["train", "--preset", "rela-g", "--calibration_gate_per_head", "0", "--output_dir",
                 str(tmp_path / "run")]) == 2
    one_error_line(capsys, "calibration_gate_per_head", "'calibrated'", "preset 'rela-g' does not use",
                   "encoder rela, decoder rela, cross rela", "--cross_attention calibrated")
    assert not (tmp_path / "run").exists()


def test_train_flags_of_the_presets_own_variants_and_of_an_overridden_site_parse():
    from hf_attn.cli.train_args import parse_train_args

    _, _, overrides, _ = parse_train_args(["--preset", "calibration-gate", "--calibration_gate_per_head", "false"])
    assert overrides == {"calibration_gate_per_head": False}
    _, _, overrides, _ = parse_train_args(["--preset", "rela-g", "--cross_attention", "calibrated",
                                           "--calibration_gate_per_head", "false"])
    assert overrides == {"cross_attention": "calibrated", "calibration_gate_per_head": False}


def test_from_preset_refuses_what_the_command_refuses():
    with pytest.raises(HfAttnConfigError, match="gmm_num_components is a hyperparameter of the 'gmm' attention, "
                                                "which preset 'reluformer' does not use"):
        HfAttnMarianConfig.from_preset("reluformer", gmm_num_components=2)
    # a site set to the variant in the same call, per layer too, and renamed variants: accepted
    assert HfAttnMarianConfig.from_preset("rela-g", cross_attention="gmm", gmm_num_components=2).gmm_num_components == 2
    config = HfAttnMarianConfig.from_preset("softmax", encoder_layers=2, encoder_attention=["softmax", "relu"],
                                            reluformer_gamma=2.0)
    assert config.reluformer_gamma == 2.0
    assert HfAttnMarianConfig.from_preset("gmm", gmm_gate_init=0.5).gmm_gate_init == 0.5


def test_swap_keeps_only_the_hyperparameters_the_new_preset_uses():
    """An hf-attn source carries every variant's hyperparameters: converting it to another preset must not trip
    the refusal (and keeps the values of the variants that preset uses)."""
    from conftest import tiny_model

    from hf_attn import swap_attention

    source = tiny_model("marian", "gmm", gmm_num_components=2)
    assert swap_attention(source, "rela-g").config.preset == "rela-g"
    assert swap_attention(source, "gmm-strict").config.gmm_num_components == 2
    with pytest.raises(HfAttnConfigError, match="does not use"):
        swap_attention(source, "rela-g", calibration_lambda=1.0)


# ---- what the command imports before it needs it ------------------------------------------------------------------
LOADED = """
import json, runpy, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["hf-attn", *json.loads(sys.argv[1])]
try:
    runpy.run_module("hf_attn.cli", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in heavy if m in sys.modules)), file=sys.stderr)
"""


def loaded_modules(*args: str) -> list[str]:
    p = subprocess.run([sys.executable, "-c", LOADED, json.dumps(list(args)), json.dumps(HEAVY)], env=offline_env(),
                       capture_output=True, text=True, timeout=300)
    return json.loads(p.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["corpora"], ["no-such-command"], ["corpora", "--help"], ["presets"],
                                  ["presets", "--verbose"], ["presets", "--bibtex", "rela-g"],
                                  ["train", "--no_such_flag"], ["train", "--base", "bart", "--d_modl", "8"]])
def test_help_corpora_presets_and_unknown_train_flags_import_neither_torch_nor_transformers(args):
    """`presets` and `train`'s unknown flags answer from hf_attn/cli/snapshot.json (tests/cli/test_snapshot.py)."""
    written = snapshot.written_with_other_transformers()
    if written and args[0] in ("presets", "train"):
        pytest.skip(f"hf_attn/cli/snapshot.json was written with transformers {written}, and another is installed: "
                    "these answers come from the registry here")
    assert loaded_modules(*args) == []
