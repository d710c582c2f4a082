"""The block-wise path of the ReLU family (ReLA, ReLUFormer) for long inputs: the values and gradients of the full
computation (kernel and every ReLU-family preset; padding, causal and cached masks; encoder, decoder and cross
sites; incremental decoding), and attention dropout that the recomputing backward pass reproduces exactly."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

import hf_attn
from hf_attn.modeling import attention_blockwise as bw
from hf_attn.modeling.masking import KeepMask

RELU_FAMILY = sorted(name for name, p in hf_attn.PRESETS.items()
                     if {p.overrides.get(f"{s}_attention") for s in ("encoder", "decoder", "cross")} & {"rela",
                                                                                                        "reluformer"})
CHUNK_FIELD = {"rela": "rela_chunk", "reluformer": "reluformer_query_chunk"}
TOL = dict(rtol=1e-5, atol=1e-5)


def masks(t: int, s: int):
    """Padding, causal, causal + padding, causal with a cache offset, and an explicit dense mask."""
    pad = torch.ones(2, s, dtype=torch.bool)
    pad[1, s - 3:] = False
    pad[1, 0] = False  # a left-padded row too: its first queries see no key under causality
    dense = torch.rand(2, 1, t, s, generator=torch.Generator().manual_seed(3)) > 0.3
    yield "padding", KeepMask(t, s, pad)
    yield "fully-padded", KeepMask(t, s, torch.stack([pad[0], torch.zeros(s, dtype=torch.bool)]))
    yield "dense", KeepMask.from_dense(dense)
    if t <= s:
        yield "causal", KeepMask(t, s, causal=True, offset=s - t)
        yield "causal-padding", KeepMask(t, s, pad, causal=True, offset=s - t)


def reference(q, k, v, keep, activation, slope, drop=None):
    """The full computation: a = act(q k^T) * keep (float32), out = (a * drop) V, and the two row sums."""
    a = bw.activate(torch.matmul(q, k.transpose(-1, -2)), activation, slope) * keep.dense()
    out = torch.matmul(a if drop is None else a * drop, v)
    return out, a.sum(-1), (a * a.clamp(min=1e-30).log()).sum(-1)


def leaves(*shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype).requires_grad_() for shape in shapes]


@pytest.mark.parametrize("chunk", [4, 16], ids=["blocks", "one-block"])
@pytest.mark.parametrize("activation", bw.ACTIVATIONS)
@pytest.mark.parametrize("t,s", [(11, 13), (13, 13), (1, 9), (3, 10)])
def test_kernel_matches_the_full_computation(activation, t, s, chunk):
    """Values and gradients of q, k, v through the output and (relu: ReLUFormer's) both row sums (float64: only the
    math may differ), block-wise and in one block (short inputs: its weights kept for the backward pass)."""
    stats = activation == "relu"
    for name, keep in masks(t, s):
        q, k, v = leaves((2, 3, t, 8), (2, 3, s, 8), (2, 3, s, 8), dtype=torch.float64)
        weights = [torch.randn(x.shape, dtype=torch.float64) for x in (q[..., :8], q[..., 0], q[..., 0])]
        got = bw.blockwise_relu_attention(q, k, v, keep, activation=activation, slope=0.1, chunk=chunk, stats=stats)
        want = reference(q, k, v, keep, activation, 0.1)
        got, want, weights = (x[:3 if stats else 1] for x in (got, want, weights))
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, **TOL, msg=name)
        got_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, weights)), (q, k, v))
        want_grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights)), (q, k, v))
        for x, y in zip(got_grads, want_grads):
            torch.testing.assert_close(x, y, **TOL, msg=name)
            assert torch.isfinite(x).all()


def test_row_statistics_need_relu():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="need activation='relu', not 'gelu'"):
        bw.blockwise_relu_attention(q, q, q, KeepMask(3, 3), activation="gelu", chunk=2, stats=True)


def _dropout_matrix(seed, p, t, s, chunk):
    """The dense dropout mask the kernel uses: each block's mask from seed + block index."""
    drop = torch.empty(2, 3, t, s)
    index = 0
    for q0 in range(0, t, chunk):
        for k0 in range(0, s, chunk):
            block = drop[:, :, q0:q0 + chunk, k0:k0 + chunk]
            block.copy_(bw._dropout_mask(block.shape, p, seed + index, "cpu", torch.float32))
            index += 1
    return drop


@pytest.mark.parametrize("chunk", [4, 16], ids=["blocks", "one-block"])
def test_dropout_masks_are_reused_by_the_backward_pass(chunk):
    """With dropout, values and gradients equal the full computation under the very masks the forward pass drew."""
    t, s, p = 10, 13, 0.3
    keep = KeepMask(t, s, causal=True, offset=s - t)
    q, k, v = leaves((2, 3, t, 8), (2, 3, s, 8), (2, 3, s, 8))
    torch.manual_seed(5)
    got, _, _ = bw.blockwise_relu_attention(q, k, v, keep, dropout=p, chunk=chunk)
    torch.manual_seed(5)
    seed = int(torch.randint(0, 2**62, ()).item())
    want, _, _ = reference(q, k, v, keep, "relu", 0.01, _dropout_matrix(seed, p, t, s, chunk))
    torch.testing.assert_close(got, want, **TOL)
    g = torch.randn_like(got)
    for x, y in zip(torch.autograd.grad((got * g).sum(), (q, k, v)), torch.autograd.grad((want * g).sum(), (q, k, v))):
        torch.testing.assert_close(x, y, **TOL)


def test_dropout_rate_and_scale():
    """v = identity reveals the dropped weights: a share p of them is zeroed, the rest is scaled by 1 / (1 - p)."""
    t = s = 64
    p = 0.1
    q = torch.ones(1, 2, t, 4)
    k = torch.ones(1, 2, s, 4)
    v = torch.eye(s).expand(1, 2, s, s)
    weights, _, _ = bw.blockwise_relu_attention(q, k, v, KeepMask(t, s), dropout=p, chunk=16)  # a = 4 everywhere
    zeros = (weights == 0).float().mean().item()
    assert abs(zeros - p) < 0.02
    torch.testing.assert_close(weights[weights != 0], torch.full_like(weights[weights != 0], 4 / (1 - p)))
    again, _, _ = bw.blockwise_relu_attention(q, k, v, KeepMask(t, s), dropout=p, chunk=16)
    assert not torch.equal(weights, again)  # a fresh seed per call


def _head_split(b, t, h, d, seed):
    """[B,T,H*dh] leaves, and q, k, v as the projections hand them to attention: ``[B,H,T,dh]`` transposed views."""
    projections = leaves(*[(b, t, h * d)] * 3, seed=seed)
    return projections, [x.view(b, t, h, d).transpose(1, 2) for x in projections]


@pytest.mark.parametrize("chunk", [4, 16], ids=["blocks", "one-block"])
def test_a_scale_applied_by_the_kernel_equals_a_scaled_q(chunk):
    """``scale`` (ReLA's number, ReLUFormer's per-query factor ``[1,1,T,1]``), applied to each block's query rows as
    they are gathered, gives the values and gradients of q handed over scaled."""
    t = 13
    keep = KeepMask(t, t, causal=True)
    for scale in (0.3, torch.rand(1, 1, t, 1, generator=torch.Generator().manual_seed(4)) + 0.5):
        projections, (q, k, v) = _head_split(2, t, 3, 8, seed=1)
        got = bw.blockwise_relu_attention(q, k, v, keep, chunk=chunk, stats=True, scale=scale)
        want = bw.blockwise_relu_attention(q * scale, k, v, keep, chunk=chunk, stats=True)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, **TOL)
        loss = [sum(o.square().sum() for o in outs) for outs in (got, want)]
        for x, y in zip(*(torch.autograd.grad(value, projections) for value in loss)):
            torch.testing.assert_close(x, y, **TOL)


def test_the_kernel_keeps_no_copy_of_q_k_v_and_sums_in_the_projections_layout():
    """Memory (attention_blockwise's docstring): a block-wise pass saves for backward the head-split views it was
    given, as SDPA does, not copies (a scaled q, contiguous k and v: three [B,H,T,dh] tensors per call); its output
    and the gradients of q, k, v come laid out [B,T,H,dh], so merging the heads and handing the gradients back to
    the projections copy nothing."""
    b, t, h, d = 2, 40, 3, 8
    projections, (q, k, v) = _head_split(b, t, h, d, seed=2)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        out, total, s_log_s = bw.blockwise_relu_attention(q, k, v, KeepMask(t, t, causal=True), chunk=16, stats=True,
                                                          scale=torch.rand(1, 1, t, 1) + 0.5)
    big = [x for x in saved if x.numel() >= b * t * h * d]
    assert [x.untyped_storage().data_ptr() for x in big] == [x.untyped_storage().data_ptr() for x in projections]
    merged = out.transpose(1, 2).reshape(b, t, h * d)
    assert merged.data_ptr() == out.data_ptr()  # a view
    layouts = {}
    for name, x in zip("qkv", (q, k, v)):
        x.register_hook(lambda grad, name=name: layouts.__setitem__(name, grad.transpose(1, 2).is_contiguous()))
    (merged.square().sum() + total.sum() + s_log_s.sum()).backward()
    assert layouts == {"q": True, "k": True, "v": True}


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _chunk_fields(preset) -> list[str]:
    variants = {hf_attn.PRESETS[preset].overrides.get(f"{s}_attention") for s in ("encoder", "decoder", "cross")}
    return [CHUNK_FIELD[v] for v in variants if v in CHUNK_FIELD]


def _model(preset, chunk, **kw):
    return tiny_model("marian", preset, **{field: chunk for field in _chunk_fields(preset)}, **kw)


def _set_chunk(model, chunk):
    for module in model.attention_modules():
        for name in ("chunk", "query_chunk"):  # ReLA's rela_chunk, ReLUFormer's reluformer_query_chunk
            if hasattr(module, name):
                setattr(module, name, chunk)


@pytest.mark.parametrize("preset", RELU_FAMILY)
def test_every_relu_family_preset_gives_the_full_values_and_gradients(preset):
    """Training step (padding, causal decoder, cross-attention) and cached decoding: block size 4 vs never."""
    b = tiny_batch(src_len=13, tgt_len=11)
    model = _model(preset, 4)
    assert all(model.config.to_dict()[field] == 4 for field in _chunk_fields(preset))
    dec = torch.full((3, 6), model.config.decoder_start_token_id)
    dec[:, 1:] = torch.randint(3, 60, (3, 5), generator=torch.Generator().manual_seed(2))
    results = {}
    for chunk in (0, 4):
        _set_chunk(model, chunk)
        model.zero_grad(set_to_none=True)
        model.train()
        out = model(**b)
        (out.loss + (out.aux_loss if out.aux_loss is not None else 0)).backward()
        steps = []
        model.eval()
        with torch.no_grad():
            enc = model.get_encoder()(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
            cache = None
            for i in range(dec.shape[1]):  # incremental decoding: the self-attention keys outgrow the block size
                step = model(encoder_outputs=enc, attention_mask=b["attention_mask"], decoder_input_ids=dec[:, i:i + 1],
                             past_key_values=cache, use_cache=True)
                cache = step.past_key_values
                steps.append(step.logits)
            full = model(encoder_outputs=enc, attention_mask=b["attention_mask"], decoder_input_ids=dec).logits
        results[chunk] = (out.loss.detach(), _grads(model), torch.cat(steps, 1), full)
    (l0, g0, s0, f0), (l4, g4, s4, f4) = results[0], results[4]
    torch.testing.assert_close(l4, l0, **TOL)
    assert g0.keys() == g4.keys()
    for name in g0:
        torch.testing.assert_close(g4[name], g0[name], **TOL, msg=name)
    torch.testing.assert_close(s4, s0, **TOL)
    torch.testing.assert_close(s4, f4, **TOL)  # cached steps = one full pass


@pytest.mark.parametrize("preset", ["rela-g", "reluformer"])
def test_blockwise_training_with_dropout_is_reproducible(preset):
    b = tiny_batch(src_len=13, tgt_len=11)
    grads = []
    for seed in (7, 7, 8):
        model = _model(preset, 4, attention_dropout=0.1)
        model.train()
        torch.manual_seed(seed)
        model(**b).loss.backward()
        grads.append(_grads(model))
    name = "model.encoder.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0)
    assert not torch.allclose(grads[2][name], grads[0][name])
    assert all(torch.isfinite(g).all() for g in grads[0].values())
