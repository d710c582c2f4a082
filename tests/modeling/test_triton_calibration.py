"""The fused Triton kernel of attention calibration (`triton_calibration`, Lu et al. 2021) under Triton's interpreter:
values and gradients against the equations written out in torch, and the model's loss and gradients against the
eager path. Tolerances: float32, 1e-5 on values and 1e-4 (relative to the largest entry) on gradients; bf16 inputs
against the float32 equations, 3e-2."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_triton, tiny_batch, tiny_model

from hf_attn.modeling import attention_calibration as calib
from hf_attn.modeling.triton_calibration import calibrated_attention, dropout_keep

pytestmark = [pytest.mark.usefixtures("one_thread"), requires_triton]
B, H, T, S, D = 3, 1, 18, 20, 16  # two blocks of 16 queries and of 16 keys, a head dim the blocks pad (BD = 16)


def inputs(dtype=torch.float32, seed=0):
    """q, k, v, q', k', q'_phi, k'_phi (the last two: the same values, separate leaves), G, H, real [B, S]: row 0
    unpadded, row 1 padded after 7 tokens, row 2 all padding (its output is discarded: finite is enough)."""
    g = torch.Generator().manual_seed(seed)

    def leaf(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).requires_grad_()

    q, k, v = leaf(B, H, T, D, scale=2.0), leaf(B, H, S, D, scale=2.0), leaf(B, H, S, D)
    qp, kp = leaf(B, H, T, D, scale=2.0), leaf(B, H, S, D, scale=2.0)
    qp_phi, kp_phi = qp.detach().clone().requires_grad_(), kp.detach().clone().requires_grad_()
    gain = torch.rand(B, H, T, generator=g)
    gain_a, gain_c = gain.clone().requires_grad_(), (1 - gain).requires_grad_()
    real = torch.ones(B, S)
    real[1, 7:] = 0
    real[2] = 0
    return q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c, real


def reference(q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c, real, mode, keep=None):
    """The equations written out (float32): Eq. 1, 4, 3 (perturbed) or 7-10 as a (G + H e^(1-m)), dropout(w) V;
    the penalty sum_j (1 - m)^2 from q'_phi, k'_phi (Eq. 6) and the mask sum."""
    q, k, v, qp, kp, qp_phi, kp_phi = (t.float() for t in (q, k, v, qp, kp, qp_phi, kp_phi))
    scale = D**-0.5
    r = real[:, None, None, :]
    visible = (r > 0) | (r.sum(-1, keepdim=True) == 0)
    a = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~visible, float("-inf")), dim=-1)
    m = torch.sigmoid(qp @ kp.transpose(-1, -2) * scale) * r
    if mode == "perturbed":
        w = m * a + (1 - m) * r / r.sum(-1, keepdim=True).clamp(min=1)
    else:
        w = a * (gain_a[..., None] + gain_c[..., None] * torch.exp(1 - m))
    if keep is not None:
        w = w * keep
    m_phi = torch.sigmoid(qp_phi @ kp_phi.transpose(-1, -2) * scale) * r
    return w @ v, ((1 - m_phi) ** 2 * r).sum(-1), (m * r).sum(-1).detach()


def losses(o, psq, weights):
    """A scalar reading every output with fixed random weights (so every gradient entry matters)."""
    total = (o.float() * weights[0]).sum()
    return total if psq is None else total + (psq * weights[1]).sum()


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, tensors, allow_unused=True)


def assert_grads_close(expected, got, rtol=1e-4, names=()):
    for i, (e, g) in enumerate(zip(expected, got)):
        name = names[i] if names else i
        if e is None:
            assert g is None or bool((g == 0).all()), name
            continue
        assert g is not None, name
        scale = max(e.abs().max().item(), 1e-6)
        assert (g.float() - e).abs().max().item() <= rtol * scale, (name, (g.float() - e).abs().max().item(), scale)


NAMES = ("q", "k", "v", "qp", "kp", "qp_phi", "kp_phi", "gain_a", "gain_c")


@pytest.mark.parametrize("mode", ("calibrated", "perturbed"))
@pytest.mark.parametrize("dropout", (0.0, 0.3))
def test_triton_calibration_kernel_matches_the_equations(mode, dropout):
    """Values, penalty, mask sum and every gradient, padded (one source all padding), two blocks each way; the
    penalty's gradient reaches q'_phi, k'_phi only and the output's q', k' only (the single-loss detach rules)."""
    t = inputs()
    q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c, real = t
    phi = (qp_phi, kp_phi) if mode == "calibrated" else None
    o, psq, msum = calibrated_attention(q, k, v, qp, kp, real, gain_a, gain_c, mode, dropout, phi, seed=7, block=16)
    keep = dropout_keep(7, (B, H, T, S), dropout) if dropout else None
    if keep is not None:  # the mask is the kernel's: about 1 - p of the entries kept, scaled by 1 / (1 - p)
        assert abs((keep > 0).float().mean().item() - (1 - dropout)) < 0.08
    o_ref, psq_ref, msum_ref = reference(*t, mode, keep)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    if mode == "calibrated":
        torch.testing.assert_close(psq, psq_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(msum, msum_ref, rtol=1e-5, atol=1e-5)
    weights = torch.randn(B, H, T, D), torch.randn(B, H, T)
    leaves = [q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c]
    got = grads_of(losses(o, psq, weights), leaves)
    expected = grads_of(losses(o_ref, psq_ref if phi else None, weights), leaves)
    assert_grads_close(expected, got, names=NAMES)


def test_triton_calibration_kernel_bf16_inputs():
    """bf16 q, k, v, q', k' (float32 accumulation) against the float32 equations on the same (rounded) inputs.
    Under the interpreter tl.dot on bf16 runs in numpy on upcast values, so this checks the kernel's casts and
    masking, not the GPU's bf16 tensor-core rounding."""
    t = inputs(torch.bfloat16, seed=1)
    q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c, real = t
    o, psq, _ = calibrated_attention(q, k, v, qp, kp, real, gain_a, gain_c, "calibrated", 0.0, (qp_phi, kp_phi),
                                     block=16)
    assert o.dtype == torch.bfloat16
    o_ref, psq_ref, _ = reference(*t, "calibrated")
    torch.testing.assert_close(o.float(), o_ref, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(psq, psq_ref, rtol=1e-3, atol=1e-3)
    weights = torch.randn(B, H, T, D), torch.randn(B, H, T)
    leaves = [q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c]
    got = grads_of(losses(o, psq, weights), leaves)
    assert all(g.dtype == x.dtype for g, x in zip(got, leaves))
    assert_grads_close(grads_of(losses(o_ref, psq_ref, weights), leaves), got, rtol=3e-2, names=NAMES)


# ---- in the model: the calibrated attend on the kernel against the eager path ---------------------------------------
SMALL = dict(decoder_attention_heads=2, encoder_attention_heads=2)  # fewer kernel programs under the interpreter


def kernel_calls(monkeypatch):
    seen = []
    original = calib.calibrated_attention

    def counted(*a, **k):
        seen.append(a[8] if len(a) > 8 else k.get("mode", "calibrated"))
        return original(*a, **k)

    monkeypatch.setattr(calib, "calibrated_attention", counted)
    return seen


@pytest.mark.parametrize("preset,overrides", [
    ("calibration-fixed", {}), ("calibration-anneal", {}), ("calibration-gate", {}),
    ("calibration-gate", {"calibration_gate_per_head": True}),
])
def test_triton_calibration_every_fusion_matches_eager_in_the_model(monkeypatch, preset, overrides):
    logits = {}
    for mode in ("eager", "triton"):
        monkeypatch.setenv("HF_ATTN_KERNELS", mode)
        model = tiny_model("marian", preset, **SMALL, **overrides)
        model.set_training_step(30000)  # anneal: r = exp(-0.3)
        seen = kernel_calls(monkeypatch)
        with torch.no_grad():
            logits[mode] = model(**tiny_batch(batch=2)).logits
        assert bool(seen) == (mode == "triton")
    torch.testing.assert_close(logits["triton"], logits["eager"], rtol=1e-5, atol=1e-5)


def test_triton_calibration_fixed_softmax_and_weights_stay_eager(monkeypatch):
    """fixed_softmax (a softmax over the fused weights needs them whole) and output_attentions take the eager path."""
    monkeypatch.setenv("HF_ATTN_KERNELS", "triton")
    seen = kernel_calls(monkeypatch)
    with torch.no_grad():
        tiny_model("marian", "calibration-fixed", calibration_fusion="fixed_softmax", **SMALL)(**tiny_batch(batch=2))
        out = tiny_model("marian", "calibration-gate", **SMALL)(**tiny_batch(batch=2), output_attentions=True)
    assert seen == [] and out.cross_attentions[0] is not None


def run_training(monkeypatch, mode, **overrides):
    monkeypatch.setenv("HF_ATTN_KERNELS", mode)
    # one decoder layer: one calibrated cross-attention (both passes), half the interpreted kernel launches
    model = tiny_model("marian", "calibration-gate", decoder_layers=1, **SMALL, **overrides).train()
    seen = kernel_calls(monkeypatch)
    out = model(**tiny_batch(batch=2))
    theta, phi = [], []
    phi_ids = {id(p) for m in calib.calibrated_modules(model) for p in m.phi_parameters()}
    for name, p in (named for named in model.named_parameters() if named[1].requires_grad):
        (phi if id(p) in phi_ids else theta).append((name, p))
    aux = torch.autograd.grad(out.aux_loss, [p for _, p in theta], retain_graph=True, allow_unused=True)
    out.loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out, grads, aux, seen


def test_triton_calibration_tiny_model_loss_logs_and_grads(monkeypatch):
    """calibration-gate training: the loss, the logged mask statistics and perturbed loss, and every gradient
    (theta from L_nmt, phi from the perturbation objective) equal the eager path's; the objective's gradient on
    theta is 0 on both paths."""
    out_e, grads_e, aux_e, _ = run_training(monkeypatch, "eager")
    out_t, grads_t, aux_t, seen = run_training(monkeypatch, "triton")
    assert sorted(set(seen)) == ["calibrated", "perturbed"]
    torch.testing.assert_close(out_t.loss, out_e.loss, rtol=1e-6, atol=1e-6)
    for name in ("mean_mask", "mask_penalty", "calibration_gate", "perturbed_loss", "perturbation_objective"):
        torch.testing.assert_close(out_t.aux_logs[name], out_e.aux_logs[name], rtol=1e-5, atol=1e-6)
    assert grads_e.keys() == grads_t.keys()
    assert_grads_close(list(grads_e.values()), list(grads_t.values()), names=list(grads_e))
    assert all(g is None or bool((g == 0).all()) for g in aux_t)


def test_triton_calibration_dropout_in_the_model_is_reproducible_and_active(monkeypatch):
    """Attention dropout in training: the kernel's mask comes from torch's generator (same seed, same loss and
    gradients) and changes the output (it is applied)."""
    def loss(seed, p):
        monkeypatch.setenv("HF_ATTN_KERNELS", "triton")
        # one decoder layer: one calibrated cross-attention, half the kernel launches of two under the interpreter
        model = tiny_model("marian", "calibration-fixed", attention_dropout=p, decoder_layers=1, **SMALL).train()
        torch.manual_seed(seed)
        out = model(**tiny_batch(batch=2))
        out.loss.backward()
        return out.loss.detach(), model.model.decoder.layers[0].encoder_attn.v_proj.weight.grad

    first, again, none = loss(0, 0.3), loss(0, 0.3), loss(0, 0.0)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], none[0])
