"""The configuration (hf_attn/modeling/configuration_hf_attn.py): one clear error for a bad field or preset, and the
attention layout of layer subsets and per-layer lists."""

from __future__ import annotations

import pytest
from conftest import tiny_config

import hf_attn
from hf_attn.modeling.hyperparameters import HfAttnConfigError


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        ({"encoder_attention": "relaa"}, r"encoder_attention='relaa' is not an attention variant \(did you mean 'rela'\?\)"),
        ({"cross_attention": ["rela"]}, r"cross_attention lists 1 variants but the model has 2 layers"),
        ({"decoder_attention_layers": [5]}, r"decoder_attention_layers=\[5\]: need layer indices in 0..1"),
        ({"rela_norm": "batchnorm"}, r"rela_norm='batchnorm' is not valid; choose one of \['rmsnorm', 'layernorm', 'none'\]"),
        ({"rela_eps": 0.0}, r"rela_eps=0.0 must be a finite number > 0 \(default 1e-08: "),
        ({"rela_nrom": "rmsnorm"}, r"unknown attention hyperparameter 'rela_nrom' \(did you mean 'rela_norm'\?\)"),
    ],
)
def test_bad_configuration_gives_one_clear_error(overrides, pattern):
    with pytest.raises(HfAttnConfigError, match=pattern):
        tiny_config("marian", "rela-g", **overrides)


# item 6 of issue 53: a site given a non-string variant, and stock size fields that cannot build a model (stock
# transformers fails deep in the model: ZeroDivisionError, a negative tensor dimension, an index error)
NOT_A_NAME = r"is not a variant name: give one of \['calibrated', .*\] as a string, or a list of them, one per layer$"


@pytest.mark.parametrize("preset,overrides,pattern", [
    ("rela-g", {"encoder_attention": {}}, r"^encoder_attention=\{\} " + NOT_A_NAME),
    ("rela-g", {"encoder_attention": 7}, r"^encoder_attention=7 " + NOT_A_NAME),
    ("softmax", {"encoder_attention": 7, "rela_norm": "none"}, r"^encoder_attention=7 " + NOT_A_NAME),
    ("softmax", {"cross_attention": ["gmm", {}], "rela_eps": 1e-6}, r"^cross_attention=\['gmm', \{\}\] " + NOT_A_NAME),
    ("gmm", {"decoder_attention": [None, "softmax"]}, r"^decoder_attention=\[None, 'softmax'\] " + NOT_A_NAME),
    ("rela-g", {"encoder_attention_heads": 0}, r"^encoder_attention_heads=0: the model needs an integer >= 1 here$"),
    ("rela-g", {"d_model": -1}, r"^d_model=-1: the model needs an integer >= 1 here$"),
    ("softmax", {"max_position_embeddings": -1}, r"^max_position_embeddings=-1: the model needs an integer >= 1 here$"),
    ("softmax", {"vocab_size": 0}, r"^vocab_size=0: the model needs an integer >= 1 here$"),
    ("softmax", {"decoder_layers": -1}, r"^decoder_layers=-1: the model needs an integer >= 0 here$"),
    ("softmax", {"decoder_ffn_dim": 0}, r"^decoder_ffn_dim=0: the model needs an integer >= 1 here$"),
    ("softmax", {"d_model": 30}, r"^encoder_attention_heads=4 does not divide d_model=30 \(each head gets d_model / "
                                 r"heads dimensions\); give a head count that divides it, e.g. \[1, 2, 3, 5, 6, 10, 15\]$"),
    ("rela-g", {"encoder_attention_layers": 5}, r"^encoder_attention_layers=5: need layer indices in 0..1 and a single"),
])
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_values_that_cannot_build_a_model_give_one_line(base, preset, overrides, pattern):
    with pytest.raises(HfAttnConfigError, match=pattern) as err:
        tiny_config(base, preset, **overrides)
    assert "\n" not in str(err.value)


def test_size_fields_are_checked_by_the_config_itself():
    """Not only from_preset: the config class (what from_pretrained builds) gives the same line."""
    with pytest.raises(HfAttnConfigError, match=r"^d_model=-1: the model needs an integer >= 1 here$"):
        hf_attn.HfAttnBartConfig(d_model=-1)
    with pytest.raises(HfAttnConfigError, match=r"^encoder_attention=\{\} is not a variant name"):
        hf_attn.HfAttnMarianConfig(encoder_attention={})


def test_unknown_preset_names_the_choices():
    with pytest.raises(HfAttnConfigError, match=r"unknown preset 'rela-x'.*valid presets: \["):
        hf_attn.HfAttnMarianConfig.from_preset("rela-x")


def test_layer_subsets_and_per_layer_lists():
    config = tiny_config("marian", "rela-g", encoder_attention_layers=[1], decoder_attention=["softmax", "rela"])
    assert config.attention_layout() == {
        "encoder": ["softmax", "rela"],
        "decoder": ["softmax", "rela"],
        "cross": ["rela", "rela"],
    }
    model = hf_attn.HfAttnMarianMTModel(config)
    assert [m.variant for m in model.attention_modules("encoder")] == ["softmax", "rela"]
