"""The variant registry (hf_attn/modeling/registry.py): every registered variant is a `VariantAttention`, the sites a
variant supports are enforced, and importing hf_attn registers the Auto classes."""

from __future__ import annotations

import pytest
from conftest import tiny_config
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import hf_attn
from hf_attn.modeling.attention_base import VariantAttention
from hf_attn.modeling.attention_rela import RelaAttention
from hf_attn.modeling.hyperparameters import HfAttnConfigError


def test_every_registered_variant_is_a_mixin():
    for name, cls in hf_attn.ATTENTION_VARIANTS.items():
        assert issubclass(cls, VariantAttention) and cls.variant == name
        assert set(cls.sites) <= {"encoder", "decoder", "cross"}


def test_variant_on_unsupported_site(monkeypatch):
    class CrossOnly(RelaAttention):
        variant = "cross-only-test"
        sites = ("cross",)
        presets = ()

    monkeypatch.setitem(hf_attn.ATTENTION_VARIANTS, "cross-only-test", CrossOnly)
    with pytest.raises(HfAttnConfigError, match=r"variant 'cross-only-test' only supports the \['cross'\] site"):
        tiny_config("marian", "softmax", encoder_attention="cross-only-test")
    tiny_config("marian", "softmax", cross_attention="cross-only-test")  # the supported site is fine


def test_import_registers_auto_classes(tmp_path):
    config = tiny_config("marian", "rela-g")
    assert type(AutoConfig.for_model("hf_attn_bart")) is hf_attn.HfAttnBartConfig
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert isinstance(model, hf_attn.HfAttnMarianMTModel)
    model.save_pretrained(tmp_path)
    again = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)  # in-process: no trust_remote_code needed
    assert type(again) is hf_attn.HfAttnMarianMTModel
    assert again.config._attn_implementation == "hf_attn"
