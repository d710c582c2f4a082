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
