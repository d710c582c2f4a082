"""`hf_attn.swap_attention` (hf_attn/swap.py): a stock checkpoint or model with its attention replaced by a preset's."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, vanilla_model

import hf_attn
from hf_attn.modeling.hyperparameters import HfAttnConfigError


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_swap_attention_on_saved_vanilla_checkpoint(base, tmp_path):
    vanilla = vanilla_model(base, seed=3)
    vanilla.save_pretrained(tmp_path / "vanilla")
    b = tiny_batch()
    with torch.no_grad():
        expected = vanilla(**b).logits

    soft = hf_attn.swap_attention(str(tmp_path / "vanilla"), "softmax").eval()
    assert soft.config.model_type == f"hf_attn_{base}"
    with torch.no_grad():
        assert (soft(**b).logits - expected).abs().max() < 1e-5

    rela = hf_attn.swap_attention(vanilla, "rela-g", rela_gain_init="ones")
    ref = vanilla.state_dict()
    copied = [k for k in rela.state_dict() if k in ref]
    assert any("q_proj" in k for k in copied) and any("fc1" in k for k in copied)
    for key in copied:
        assert torch.equal(rela.state_dict()[key], ref[key]), key
    new = set(rela.state_dict()) - set(ref)
    assert new and all("rela_" in k for k in new)
    # the architecture is the checkpoint's, the attention is the preset's
    assert rela.config.d_model == vanilla.config.d_model and rela.config.encoder_attention == "rela"


def test_swap_attention_rejects_other_models():
    with pytest.raises(HfAttnConfigError, match="MarianMTModel and BartForConditionalGeneration"):
        hf_attn.swap_attention(torch.nn.Linear(2, 2), "rela-g")
