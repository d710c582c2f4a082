"""GMM cross-attention's distributed path (`GmmAttention.attend_distributed`): gamma V = (1 - g)(alpha V) + g(beta V)
with alpha V by SDPA (Zhang & Feng 2021, Eq. 13, 15), against the written-out path (``HF_ATTN_KERNELS=eager``).

The names contain ``triton`` so that ``pytest -k triton`` runs them with the fused Triton kernels' tests: like the
kernels, the path runs on CUDA by default and on CPU when forced (``HF_ATTN_KERNELS=triton``, as here), and it
replaces the materialised attention matrix the same way (with SDPA's fused kernel instead of one of ours).
Tolerances: float32 sums in another order, 1e-5 relative (values) and 1e-4 (gradients); bf16 (SDPA on bf16 inputs
against the float32 eager path): 3e-2 on the output."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

from hf_attn.modeling import attention_gmm

FUSIONS = ("gate", "average", "gmm_only", "dot")
pytestmark = pytest.mark.usefixtures("one_thread")


def run(monkeypatch, mode, preset="gmm", train=True, grads=True, **overrides):
    """(loss, logits, {name: grad}) of one forward (+ backward) of a tiny padded batch on path ``mode``."""
    monkeypatch.setenv("HF_ATTN_KERNELS", mode)
    model = tiny_model("marian", preset, **overrides).train(train)
    out = model(**tiny_batch())
    if not grads:
        return out.loss.detach(), out.logits.detach(), {}
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(eager, fused, rtol=1e-4):
    assert eager.keys() == fused.keys()
    for name, g in eager.items():  # relative to the largest entry (k_proj's bias has a true gradient of 0)
        scale = max(g.abs().max().item(), 1e-6)
        assert (fused[name] - g).abs().max().item() <= rtol * scale, name


def calls(monkeypatch):
    """Counts `attend_distributed` calls (so a test knows which path ran)."""
    seen = []
    original = attention_gmm.GmmAttention.attend_distributed

    def counted(self, *a, **k):
        seen.append(self.fusion)
        return original(self, *a, **k)

    monkeypatch.setattr(attention_gmm.GmmAttention, "attend_distributed", counted)
    return seen


@pytest.mark.parametrize("fusion", FUSIONS)
def test_triton_group_gmm_distributed_path_matches_eager_values_and_gradients(monkeypatch, fusion):
    loss_e, logits_e, grads_e = run(monkeypatch, "eager", gmm_fusion=fusion)
    seen = calls(monkeypatch)
    loss_f, logits_f, grads_f = run(monkeypatch, "triton", gmm_fusion=fusion)
    assert seen and set(seen) == {fusion}
    torch.testing.assert_close(logits_f, logits_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss_f, loss_e, rtol=1e-6, atol=1e-6)
    assert_grads_close(grads_e, grads_f)


@pytest.mark.parametrize("preset", ("gmm-strict", "gmm-synthesis"))
def test_triton_group_gmm_distributed_path_matches_eager_for_other_normalisations(monkeypatch, preset):
    loss_e, logits_e, grads_e = run(monkeypatch, "eager", preset)
    loss_f, logits_f, grads_f = run(monkeypatch, "triton", preset)
    torch.testing.assert_close(logits_f, logits_e, rtol=1e-5, atol=1e-5)
    assert_grads_close(grads_e, grads_f)


def test_triton_group_gmm_tiny_model_loss_and_grads(monkeypatch):
    """The `gmm` preset, the Bart base and a batch with a one-token source: loss and every gradient."""
    results = {}
    for mode in ("eager", "triton"):
        monkeypatch.setenv("HF_ATTN_KERNELS", mode)
        model = tiny_model("bart", "gmm").train()
        out = model(**tiny_batch(batch=4, src_len=8, tgt_len=6, seed=3))
        out.loss.backward()
        results[mode] = out.loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(results["triton"][0], results["eager"][0], rtol=1e-6, atol=1e-6)
    assert_grads_close(results["eager"][1], results["triton"][1])


def test_triton_group_gmm_decoding_matches_eager(monkeypatch):
    """Beam search with the cache (one query row per step) gives the same tokens on both paths."""
    ids = {}
    for mode in ("eager", "triton"):
        monkeypatch.setenv("HF_ATTN_KERNELS", mode)
        model = tiny_model("marian", "gmm", seed=4)
        b = tiny_batch()
        with torch.no_grad():
            ids[mode] = model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=3,
                                       max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert torch.equal(ids["triton"], ids["eager"])


def test_triton_group_gmm_attention_dropout_keeps_the_papers_single_mask(monkeypatch):
    """With attention dropout active the paper drops gamma with one mask, which SDPA cannot: the eager path runs
    (and the distributed path again once the model is in eval mode)."""
    seen = calls(monkeypatch)
    run(monkeypatch, "triton", attention_dropout=0.3)
    assert seen == []
    run(monkeypatch, "triton", train=False, grads=False, attention_dropout=0.3)
    assert seen


def test_triton_group_gmm_weights_eager_flags_and_cpu_default_take_the_written_out_path(monkeypatch):
    """output_attentions and mode eager: the written-out path; on CPU it is also the default (mode auto), the
    distributed path runs there only when forced (mode triton)."""
    seen = calls(monkeypatch)
    model = tiny_model("marian", "gmm")
    b = tiny_batch()
    monkeypatch.setenv("HF_ATTN_KERNELS", "triton")
    with torch.no_grad():
        out = model(**b, output_attentions=True)
    assert seen == [] and out.cross_attentions[0] is not None
    for mode in ("eager", "auto"):
        monkeypatch.setenv("HF_ATTN_KERNELS", mode)
        with torch.no_grad():
            model(**b)
        assert seen == []
    monkeypatch.setenv("HF_ATTN_KERNELS", "triton")
    with torch.no_grad():
        model(**b)
    assert seen and set(seen) == {"gate"}


def test_triton_group_gmm_bf16_autocast_is_close_to_float32(monkeypatch):
    _, logits_32, _ = run(monkeypatch, "eager", train=False, grads=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, logits_16, _ = run(monkeypatch, "triton", train=False, grads=False)
    assert torch.isfinite(logits_16).all()
    torch.testing.assert_close(logits_16.float(), logits_32, rtol=3e-2, atol=3e-2)
