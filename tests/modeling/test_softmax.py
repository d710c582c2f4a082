"""Softmax and its sparse baselines (hf_attn/modeling/attention_softmax.py): the softmax preset is the stock model,
sparsemax and 1.5-entmax in float32 under autocast and on fully masked rows, the forward-only path equals the
`entmax` package, and a missing `entmax` names its install command."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_context, tiny_batch, tiny_config, tiny_model, vanilla_model
from transformers.models.marian.modeling_marian import MarianAttention

from hf_attn.modeling import attention_softmax
from hf_attn.modeling.attention_base import attention_class
from hf_attn.modeling.masking import KeepMask


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_softmax_preset_matches_vanilla_logits(base):
    vanilla = vanilla_model(base)
    ours = tiny_model(base, "softmax")
    missing, unexpected = ours.load_state_dict(vanilla.state_dict(), strict=True)
    b = tiny_batch()
    with torch.no_grad():
        expected = vanilla(**b).logits
        got = ours(**b).logits
    assert (got - expected).abs().max() < 1e-5


def test_missing_entmax_names_the_install_command(monkeypatch):
    monkeypatch.setattr(attention_softmax, "sparsemax", None)
    with pytest.raises(ImportError, match=r"pip install entmax"):
        tiny_model("marian", "sparsemax")


def _module(mixin, **config_overrides):
    config = tiny_config("marian", "softmax", **config_overrides)
    cls = attention_class(MarianAttention, mixin)
    module = cls(embed_dim=32, num_heads=4, config=config, layer_idx=0, site="cross")
    from transformers import initialization as init

    module.init_variant_weights(init)
    return module.eval()


@pytest.mark.parametrize("mixin", [attention_softmax.SparsemaxAttention, attention_softmax.Entmax15Attention])
@pytest.mark.parametrize("grad", [True, False], ids=["train", "decode"])
def test_entmax_family_float32_under_autocast_and_empty_rows(mixin, grad, monkeypatch):
    module = _module(mixin)
    seen = []
    for name in ("normaliser", "forward_only"):
        original = getattr(mixin, name)
        monkeypatch.setattr(mixin, name, staticmethod(lambda scores, f=original, n=name: seen.append((n, scores.dtype))
                                                      or f(scores)))
    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=grad) for _ in range(3))
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[1] = False  # a fully masked example: must not crash or NaN
    keep[0, :, :, 3:] = False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ctx, weights = module.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), KeepMask.from_dense(keep),
                                     attention_context(True))
    # the package's autograd function when a gradient is needed, the forward-only one otherwise
    assert seen == [("normaliser" if grad else "forward_only", torch.float32)]
    assert torch.isfinite(ctx.float()).all() and torch.isfinite(weights.float()).all()
    assert (weights[0, :, :, 3:] == 0).all()
    torch.testing.assert_close(weights[0].float().sum(-1), torch.ones(4, 5), rtol=1e-2, atol=1e-2)
    if grad:
        ctx.float().sum().backward()
        assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0


@pytest.mark.parametrize("mixin", [attention_softmax.SparsemaxAttention, attention_softmax.Entmax15Attention])
def test_entmax_forward_only_equals_the_package(mixin):
    torch.manual_seed(0)
    z = torch.randn(64, 4, 3, 30) * 4
    z[0, :, :, -5:] = attention_softmax.MASKED_SCORE  # masked keys, as `attend` fills them
    z[1, 0, 0] = 0.5  # all tied
    z[2, 0, 0, :2] = 50.0  # a large tie at the top
    z[3] = z[3] * 100  # one-hot rows
    expected = mixin.normaliser(z)
    got = mixin.forward_only(z)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
    assert torch.equal(got == 0, expected == 0)  # the same support
