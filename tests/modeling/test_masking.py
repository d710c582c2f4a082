"""Attention masks (hf_attn/modeling/masking.py): what the variants read from a `KeepMask` equals the dense mask's
definitions, and masks are built on the device of the call."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from hf_attn.modeling.masking import KeepMask


def keep_masks(t: int, s: int):
    """Compact masks of each kind (none, padding, fully padded, causal, causal + padding, cached) and a dense one."""
    pad = torch.ones(2, s, dtype=torch.bool)
    pad[1, s - 2:] = False
    yield KeepMask(t, s)
    yield KeepMask(t, s, pad)
    yield KeepMask(t, s, torch.stack([pad[0], torch.zeros(s, dtype=torch.bool)]))
    yield KeepMask(t, s, causal=True, offset=s - t)
    yield KeepMask(t, s, pad, causal=True, offset=s - t)
    yield KeepMask(1, s, pad, causal=True, offset=s - 1)
    yield KeepMask.from_dense(torch.rand(2, 1, t, s, generator=torch.Generator().manual_seed(0)) > 0.4)


@pytest.mark.parametrize("keep", list(keep_masks(4, 6)), ids=lambda m: f"{m.q_len}x{m.k_len}")
def test_keep_mask_helpers_match_the_dense_mask(keep):
    """What the variants read from a `KeepMask` equals the dense-mask definitions: fill where no key is visible
    (except rows with none, which see all), the 0/1 product, and the keys some query sees."""
    dense = keep.dense()
    scores = torch.randn(2, 3, keep.q_len, keep.k_len)
    hidden = ~(dense | ~dense.any(-1, keepdim=True))
    assert torch.equal(keep.fill_hidden(scores, -1e9), scores.masked_fill(hidden, -1e9))
    assert torch.equal(keep.zero_hidden(scores), scores * dense)
    filled = keep.scale_and_fill(scores, 0.125, -1e9)
    torch.testing.assert_close(filled, (scores * 0.125).masked_fill(hidden, -1e9), rtol=0, atol=1e-6)
    assert keep.scale_and_fill(scores, 0.125, -1e9).eq(filled).all()  # the bias is built once
    real = keep.real_keys()
    assert torch.equal(real.expand(2, 1, 1, keep.k_len), dense.any(-2, keepdim=True).expand(2, 1, 1, keep.k_len))
    assert keep.real_keys() is real  # built once per stack
    keep.sdpa_mask(torch.float32)
    keep.zero_hidden(scores[..., : keep.q_len - 1, :])  # a sub-block
    # what it builds once is kept under plain attribute names: dynamo cannot trace a dotted one ("_sdpa_torch.float32")
    assert all(name.isidentifier() for name in vars(keep)), sorted(vars(keep))


def test_masks_are_built_on_the_device_of_the_call():
    """A causal mask without padding holds no tensor: it must still build its blocks where the attention runs (on a
    GPU every ReLU-family, GMM and calibration training step once failed on a CPU mask). The meta device stands in
    for a GPU."""
    from hf_attn.modeling.masking import KeepMask, keep_from_mask, keep_mask_interface
    from transformers.masking_utils import causal_mask_function

    meta = torch.device("meta")
    made = [keep_from_mask(None, 3, 3, True, device=meta),
            keep_mask_interface(2, 3, 3, mask_function=causal_mask_function, attention_mask=None, device=meta)]
    model = tiny_model("marian", "rela-g").to("meta")
    made.append(model.model.decoder.layers[0].self_attn.keep_mask(None, 3, 3))
    for keep in made:
        assert isinstance(keep, KeepMask) and keep.padding is None and keep.causal
        assert keep.device == meta and keep.block(0, 3, 0, 3).device == meta
        assert keep.zero_hidden(torch.ones(2, 1, 3, 3, device=meta)).device == meta
        assert keep.last_keys(2).device == meta
