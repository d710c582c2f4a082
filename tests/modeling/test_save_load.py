"""Saving and loading hf-attn models: the variants' parameters come back as saved, not reinitialised, and frozen
tensors stay frozen."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import hf_attn


def test_variant_params_survive_reload_and_are_not_reinitialised(tmp_path):
    model = tiny_model("marian", "rela-i")
    model.save_pretrained(tmp_path)
    again = hf_attn.HfAttnMarianMTModel.from_pretrained(tmp_path)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("preset", sorted(hf_attn.PRESETS))
def test_loading_keeps_every_presets_frozen_weights_frozen(preset, tmp_path):
    """A resumed run's optimizer must see the trainable parameters of the run that saved it (gmm-only's k_proj once
    came back trainable, and resuming failed on the optimizer's parameter groups)."""
    model = tiny_model("marian", preset)
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    model.save_pretrained(tmp_path)
    again = type(model).from_pretrained(tmp_path)
    assert sorted(n for n, p in again.named_parameters() if not p.requires_grad) == frozen


def test_loading_keeps_the_sinusoidal_positions_frozen(tmp_path):
    """transformers' loader swaps in trainable Parameters; fine-tuning or resuming must not train fixed tensors."""
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model("marian", "rela-g")
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    assert frozen == ["model.decoder.embed_positions.weight", "model.encoder.embed_positions.weight"]
    model.save_pretrained(tmp_path)
    for again in (type(model).from_pretrained(tmp_path), AutoModelForSeq2SeqLM.from_pretrained(tmp_path)):
        assert sorted(n for n, p in again.named_parameters() if not p.requires_grad) == frozen
