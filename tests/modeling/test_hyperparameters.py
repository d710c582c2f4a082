"""Variant hyperparameters are declared once (`Hyperparameter`: type, default, valid values, help) and drive the
config checks, the `hf-attn train` flags and `hf-attn presets --verbose`; the train and decode flags' range checks
(`validate.Flag`) share their valid values and words (`ValidValues`)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import BASE_DEFAULTS, TINY

import hf_attn
from hf_attn.cli import main
from hf_attn.cli.train_args import build_train_parser, parse_train_args
from hf_attn.errors import HfAttnInputError
from hf_attn.modeling.hyperparameters import HfAttnConfigError, Hyperparameter
from hf_attn.training import validate
from hf_attn.modeling.configuration_hf_attn import hyperparameters
from hf_attn.training.args import MODEL_DEFAULTS
from hf_attn.modeling.bases import BASES

# every variant hyperparameter: (command-line text, the value model.config must hold), never the default
CLI_VALUES = {
    "rela_activation": ("leaky_relu", "leaky_relu"),
    "rela_norm": ("layernorm", "layernorm"),
    "rela_gate": ("false", False),
    "rela_gain_init": ("uniform", "uniform"),
    "rela_eps": ("1e-6", 1e-6),
    "rela_leaky_relu_slope": ("0.2", 0.2),
    "rela_chunk": ("8", 8),
    "gmm_num_components": ("2", 2),
    "gmm_normalization": ("strict", "strict"),
    "gmm_fusion": ("average", "average"),
    "gmm_share_mean": ("true", True),
    "gmm_share_sigma": ("True", True),
    "gmm_share_weight": ("1", True),
    "gmm_sigma_min": ("0.75", 0.75),
    "gmm_layer_subset": ("top2", "top2"),
    "gmm_gate_init": ("0.3", 0.3),
    "ran_max_positions": ("64", 64),
    "ran_transition": ("tanh_layernorm", "tanh_layernorm"),
    "ran_transition_dim": ("512", 512),
    "ran_freeze_initial": ("true", True),
    "ran_attention_dropout": ("0.1", 0.1),
    "ran_drop_position_embeddings": ("both", "both"),
    "hard_gaussian_std": ("2.5", 2.5),
    "hard_gaussian_encoder_offsets": ("-2,2", [-2, 2]),
    "hard_gaussian_decoder_offsets": ("[-2, 0]", [-2, 0]),
    "hard_gaussian_cross_offsets": ("1", [1]),
    "hard_gaussian_length_ratio": ("1.5", 1.5),
    "hard_gaussian_normalize": ("true", True),
    "synthesizer_max_positions": ("64", 64),
    "synthesizer_init": ("ones", "ones"),
    "reluformer_scale": ("false", False),
    "reluformer_gamma": ("2", 2.0),
    "reluformer_reg_weight": ("0.5", 0.5),
    "reluformer_entropy_bound": ("0.5", 0.5),
    "reluformer_eps": ("1e-5", 1e-5),
    "reluformer_query_chunk": ("4", 4),
    "calibration_fusion": ("anneal", "anneal"),
    "calibration_lambda": ("0.2", 0.2),
    "calibration_anneal_steps": ("400", 400.0),
    "calibration_alpha": ("0.001", 0.001),
    "calibration_gate_per_head": ("true", True),
    "calibration_label_smoothing": ("0", 0.0),
}
# the preset (plus site choices) that uses each variant at the sites its hyperparameters act on
VARIANT_RUNS = {
    "rela": ["--preset", "rela-g"],
    "gmm": ["--preset", "gmm"],
    "recurrent": ["--preset", "ran-all"],
    "hard-gaussian": ["--preset", "hard-gaussian", "--cross_attention", "hard-gaussian"],
    "synthesizer": ["--preset", "synthesizer"],
    "reluformer": ["--preset", "reluformer"],
    "calibrated": ["--preset", "calibration-gate"],
}
SMALL = ["--d_model", "32", "--encoder_layers", "2", "--decoder_layers", "2", "--encoder_attention_heads", "4",
         "--decoder_attention_heads", "4", "--encoder_ffn_dim", "64", "--decoder_ffn_dim", "64",
         "--max_position_embeddings", "64"]


def build(argv, tmp_path, base="marian"):
    """`hf-attn train`'s parser, then the config and model as `hf_attn.training.run.train` builds them."""
    hargs, _, overrides, _ = parse_train_args([*argv, *SMALL, "--base", base, "--output_dir", str(tmp_path)])
    cfg_cls, model_cls = BASES[base].config_class, BASES[base].model_class
    tokens = {k: TINY[k] for k in ("vocab_size", "pad_token_id", "eos_token_id", "forced_eos_token_id")}
    config = cfg_cls.from_preset(hargs.preset, **{**MODEL_DEFAULTS, **tokens, **BASE_DEFAULTS[base], **overrides})
    return model_cls(config)


def test_the_table_covers_every_declared_hyperparameter():
    declared = hyperparameters()
    assert set(CLI_VALUES) == set(declared)
    for name, (_, value) in CLI_VALUES.items():
        assert value != declared[name].initial(), f"{name}: pick a non-default value"
    owners = {cls.variant for cls in hf_attn.ATTENTION_VARIANTS.values() if cls.hyperparameters}
    assert owners == set(VARIANT_RUNS)


@pytest.mark.parametrize("variant", sorted(VARIANT_RUNS))
def test_every_hyperparameter_can_be_set_from_the_command_line(variant, tmp_path):
    """Each variant's hyperparameters, all non-default, parsed by the real `hf-attn train` parser, reach
    model.config with their declared type."""
    cls = hf_attn.ATTENTION_VARIANTS[variant]
    argv = list(VARIANT_RUNS[variant])
    for hp in cls.hyperparameters:
        argv += [f"--{hp.name}", CLI_VALUES[hp.name][0]]
    model = build(argv, tmp_path, base="bart" if variant == "gmm" else "marian")
    assert variant in {v for layout in model.config.attention_layout().values() for v in layout}
    for hp in cls.hyperparameters:
        got, want = getattr(model.config, hp.name), CLI_VALUES[hp.name][1]
        assert got == want and type(got) is type(want), (hp.name, got, want)
        if isinstance(want, list):
            assert all(type(x) is type(y) for x, y in zip(got, want)), (hp.name, got)


def test_dashes_none_and_the_saved_config(tmp_path):
    """``--flag-name`` works, ``none`` sets a nullable hyperparameter to None, and the values survive config.json."""
    argv = ["--preset", "ran-all", "--ran-transition-dim", "128", "--ran_attention_dropout", "none",
            "--cross-attention", "hard-gaussian", "--hard-gaussian-encoder-offsets", "-3"]  # (a site uses it)
    model = build(argv, tmp_path)
    assert model.config.ran_transition_dim == 128 and model.config.ran_attention_dropout is None
    assert model.config.hard_gaussian_encoder_offsets == [-3]
    model.config.save_pretrained(tmp_path / "saved")
    again = hf_attn.HfAttnMarianConfig.from_pretrained(tmp_path / "saved")
    assert again.ran_transition_dim == 128 and again.ran_attention_dropout is None


@pytest.mark.parametrize(
    "flag,value,pattern",
    [
        ("ran_transition_dim", "abc", r"ran_transition_dim='abc' must be an integer >= 1 or None \(default None: "),
        ("ran_transition_dim", "0", r"ran_transition_dim=0 must be an integer >= 1 or None"),
        ("reluformer_eps", "0.5", r"reluformer_eps=0\.5 must be in \(0, 0\.01\] \(default 1e-06: .*Shen et al"),
        ("gmm_fusion", "sum", (r"gmm_fusion='sum' is not valid; choose one of \['gate', 'average', 'gmm_only', "
                               r"'dot'\] \(default 'gate': .*Zhang & Feng 2021")),
        ("rela_gate", "maybe", r"rela_gate='maybe' must be true or false \(default True: "),
        ("hard_gaussian_decoder_offsets", "1,2", (r"hard_gaussian_decoder_offsets=\[1, 2\] must be a non-empty list "
                                                  r"of integers <= 0 \(default \[-1, 0\]: ")),
        ("hard_gaussian_encoder_offsets", "0.5", (r"hard_gaussian_encoder_offsets='0\.5' must be a non-empty list "
                                                  r"of integers")),
        ("gmm_num_components", "2.5", r"gmm_num_components='2\.5' must be an integer >= 1 \(default 4: "),
    ],
)
def test_bad_flag_values_give_one_error_line(flag, value, pattern, tmp_path, capsys):
    assert main(["train", "--max_steps", "1", "--output_dir", str(tmp_path), f"--{flag}", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hf-attn: error: argument --{flag}"), err
    assert re.search(pattern, err[0]), err[0]


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("gmm_num_components", "4", r"gmm_num_components='4' must be an integer >= 1 \(default 4: "),
        ("gmm_num_components", True, r"gmm_num_components=True must be an integer"),
        ("rela_leaky_relu_slope", 1.5, r"rela_leaky_relu_slope=1\.5 must be in \[0, 1\]"),
        ("ran_attention_dropout", 1.0, r"ran_attention_dropout=1\.0 must be in \[0, 1\) or None"),
        ("hard_gaussian_cross_offsets", [], r"hard_gaussian_cross_offsets=\[\] must be a non-empty list of integers"),
        ("calibration_fusion", "sum", r"calibration_fusion='sum' is not valid; choose one of \['fixed', "),
    ],
)
def test_bad_config_values_give_one_line(field, value, pattern):
    with pytest.raises(HfAttnConfigError, match=pattern) as e:
        hf_attn.HfAttnMarianConfig.from_preset("softmax", **{**TINY, field: value})
    assert "\n" not in str(e.value)


def test_values_read_back_from_json_validate_in_their_declared_type():
    """JSON may give floats for ints (512.0) and ints for floats (1); both load, in the declared type."""
    config = hf_attn.HfAttnMarianConfig(**TINY, reluformer_query_chunk=512.0, ran_transition_dim=256.0,
                                        reluformer_gamma=1, hard_gaussian_encoder_offsets=(-1.0, 1.0))
    assert config.reluformer_query_chunk == 512 and type(config.reluformer_query_chunk) is int
    assert type(config.ran_transition_dim) is int and type(config.reluformer_gamma) is float
    assert config.hard_gaussian_encoder_offsets == [-1, 1] and all(type(x) is int for x in config.hard_gaussian_encoder_offsets)


def test_validation_does_not_change_the_config(tmp_path):
    """gmm_layer_subset is resolved by the layout, not written into cross_attention_layers; old configs (which
    had it written) still load with the same layout."""
    config = hf_attn.HfAttnMarianConfig.from_preset("gmm-top2", **{**TINY, "decoder_layers": 4})
    before = config.to_dict()
    config.validate_attention()
    assert config.to_dict() == before and config.cross_attention_layers is None
    assert config.attention_layout()["cross"] == ["softmax", "softmax", "gmm", "gmm"]
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["cross_attention_layers"] = [2, 3]  # as configs saved before this change hold it
    (tmp_path / "config.json").write_text(json.dumps(saved))
    old = hf_attn.HfAttnMarianConfig.from_pretrained(tmp_path)
    assert old.attention_layout() == config.attention_layout()


def test_train_help_lists_types_choices_and_paper_help():
    text = " ".join(build_train_parser([]).format_help().split())
    assert "--hard_gaussian_encoder_offsets INT,INT,..." in text
    assert "--ran_transition_dim INT|none" in text
    assert "--gmm_fusion {gate,average,gmm_only,dot}" in text
    assert "--rela_gate {true,false}" in text
    for hp in hyperparameters().values():
        assert " ".join(hp.help.split()) in text, hp.name


def test_presets_verbose_lists_every_preset_and_hyperparameter(capsys):
    assert main(["presets", "--verbose"]) == 0
    out = capsys.readouterr().out
    for name, preset in hf_attn.PRESETS.items():
        assert re.search(rf"^{re.escape(name)} +{re.escape(preset.description)}$", out, re.MULTILINE), name
    for variant, cls in hf_attn.ATTENTION_VARIANTS.items():
        assert re.search(rf"^{re.escape(variant)} \(sites: ", out, re.MULTILINE), variant
        for hp in cls.hyperparameters:
            line = f"--{hp.name} {hp.type_name()}: {hp.valid_values()}; default {hp.initial()!r}"
            assert line in out and hp.help in out, hp.name


# ------------------------------------------------------------------------------------ the flags share the checker
def test_flags_and_hyperparameters_share_one_range_check_and_its_words():
    ranges = [dict(low=0.0, high=1.0, high_open=True), dict(low=0.0, low_open=True), dict(low=1),
              dict(low=0, high=2 ** 32 - 1), dict(low=1.0, also=((0, "keep all"),)), {}]
    for kind, rng in zip((float, float, int, int, float, float), ranges):
        flag = validate.Flag("x", kind, **rng)
        hp = Hyperparameter("x", kind, None, "help", nullable=True, **rng)
        assert flag.valid_values() + " or None" == hp.valid_values()
        for value in (-1, 0, 0.5, 1, 2.5, 16, 2 ** 32, float("nan"), True, "1"):
            assert flag.accepts(value) == hp.accepts(value), (rng, value)
    assert validate.Flag("seed", int, low=0, high=2 ** 32 - 1).valid_values() == "an integer in [0, 4294967295]"


def test_flag_errors_are_one_line_naming_the_flag_value_and_valid_values():
    flags = {f.name: f for f in validate.TRAIN_FLAGS}
    for name, value in (("max_steps", -1), ("max_steps", 1), ("seed", 0), ("seed", 2 ** 32 - 1),
                        ("max_length_ratio", 0), ("max_length_ratio", 1.5), ("embedding_init_std", 0.0)):
        flags[name].check(value)  # valid: the special values too
    for name, value, message in (
            ("max_steps", -2, "--max_steps -2 must be an integer >= 1, or -1 (with --num_train_epochs or --minutes)"),
            ("seed", 2 ** 32, "--seed 4294967296 must be an integer in [0, 4294967295]"),
            ("seed", -1, "--seed -1 must be an integer in [0, 4294967295]"),
            ("warmup_ratio", 1.0, "--warmup_ratio 1.0 must be in [0, 1)"),
            ("max_length_ratio", 0.5, "--max_length_ratio 0.5 must be a finite number >= 1, or 0 (keep all)")):
        with pytest.raises(HfAttnInputError) as e:
            flags[name].check(value)
        assert str(e.value) == message
