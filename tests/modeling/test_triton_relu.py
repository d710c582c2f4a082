"""The fused Triton kernels of the ReLU family (`triton_relu`) against the eager path, under Triton's interpreter
(conftest sets TRITON_INTERPRET=1): values AND gradients of q, k, v (through the output and ReLUFormer's row
statistics) for padded, causal, cached (causal with an offset) and cross-attention masks, every activation,
dropout (against an eager reference that uses the kernel's own mask), float32 / bfloat16 / float16, and whole tiny
rela-g and reluformer Marian models. Shapes are small (the interpreter runs every program in Python) but span
several ragged tiles: the interpreter's tiles are 32 x 32 (`triton_relu._launch_config`)."""

from __future__ import annotations

import pytest
import torch
from conftest import requires_triton, tiny_batch, tiny_model

from hf_attn.modeling import attention_rela, attention_reluformer
from hf_attn.modeling import triton_relu as tr
from hf_attn.modeling.attention_blockwise import activate
from hf_attn.modeling.fused import KERNELS_ENV, interpreting, tl, triton
from hf_attn.modeling.masking import KeepMask

pytestmark = [pytest.mark.skipif(triton is None or not interpreting(), reason="needs triton (interpreter on CPU)"),
              requires_triton]
SLOPE = 0.1
FP32_TOL = dict(rtol=1e-4, atol=1e-4)  # float32 kernel vs float64 reference: summation order only


def padding(s: int) -> torch.Tensor:
    """Two sequences over ``s`` keys: one full, one padded at the end and at position 0 (its first causal queries
    see no key at all: a null row)."""
    pad = torch.ones(2, s, dtype=torch.bool)
    pad[1, s - 5:] = False
    pad[1, 0] = False
    return pad


def leaves(b, h, t, s, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, h, n, d, generator=g) * 0.7).to(dtype).requires_grad_() for n in (t, s, s)]


def reference(q, k, v, keep, activation, drop=None, scale=1.0):
    """The eager computation in float64: a = act(scale q k^T) * keep, out = (a * drop) v, and the two row sums."""
    q, k, v = (x.double() for x in (q, k, v))
    a = activate((q * scale) @ k.transpose(-1, -2), activation, SLOPE) * keep.dense()
    out = (a if drop is None else a * drop.double()) @ v
    return out, a.sum(-1), (a * a.clamp(min=1e-30).log()).sum(-1)


def values_and_grads(fn, q, k, v, stats, seed=0):
    """(out, row sums..., dq, dk, dv) of fn(q, k, v), the loss a fixed random projection of every output."""
    outs = [x for x in fn(q, k, v)[: 3 if stats else 1]]
    g = torch.Generator().manual_seed(seed + 7)
    loss = sum((x.double() * torch.randn(x.shape, generator=g, dtype=torch.float64)).sum() for x in outs)
    return [x.detach().double() for x in outs] + [x.double() for x in torch.autograd.grad(loss, (q, k, v))]


def assert_close_all(got, want, names, **tol):
    for name, a, b in zip(names, got, want):
        scale = b.abs().max().clamp(min=1.0)  # (relative to the largest entry: the gradients reach ~10-100)
        torch.testing.assert_close(a / scale, b / scale, **tol, msg=lambda m, n=name: f"{n}: {m}")


NAMES = ("out", "row_sum", "s_log_s", "dq", "dk", "dv")
CASES = {  # name: (activation, stats, t, s, head dim, mask builder); head dims not a power of two are padded
    "relu-padding-cross-stats": ("relu", True, 37, 45, 24, lambda t, s: KeepMask(t, s, padding(s))),
    "relu-causal-padding-stats": ("relu", True, 40, 40, 24, lambda t, s: KeepMask(t, s, padding(s), causal=True)),
    "gelu-cached-causal-padding": ("gelu", False, 6, 41, 64, lambda t, s: KeepMask(t, s, padding(s), causal=True,
                                                                                 offset=s - t)),
    "leaky-causal": ("leaky_relu", False, 40, 40, 24, lambda t, s: KeepMask(t, s, causal=True)),
    "relu-one-query-all-visible": ("relu", False, 1, 9, 8, lambda t, s: KeepMask(t, s)),
    "relu-broadcast-padding": ("relu", False, 5, 9, 128, lambda t, s: KeepMask(t, s, padding(s)[1:])),
}


@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_matches_eager_values_and_gradients(case):
    """float32: outputs, row statistics and dq, dk, dv (through both) within 1e-4 of the float64 eager path,
    relative to the largest entry; the kernel scales the scores itself (``scale``, as ReLA's 1 / sqrt(dh))."""
    activation, stats, t, s, d, mask = CASES[case]
    keep = mask(t, s)
    q, k, v = leaves(2, 2, t, s, d)

    def kernel(q, k, v):
        return tr.triton_relu_attention(q, k, v, keep, activation=activation, slope=SLOPE, stats=stats, scale=0.6)

    got = values_and_grads(kernel, q, k, v, stats)
    want = values_and_grads(lambda q, k, v: reference(q, k, v, keep, activation, scale=0.6), q, k, v, stats)
    names = NAMES if stats else NAMES[:1] + NAMES[3:]
    assert_close_all(got, want, names, **FP32_TOL)


if triton is not None:

    @triton.jit
    def _dropout_mask_kernel(Out, Seed, H, T, S, p, BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr):
        """The multiplier (0 or 1 / (1 - p)) the kernels apply to every (query, key) of head program_id(0)."""
        bh = tl.program_id(0)
        qi = tl.arange(0, BLOCK_T)[:, None]
        kj = tl.arange(0, BLOCK_S)[None, :]
        scale = tr._dropout_scale(tl.load(Seed), qi, kj, bh, p)
        tl.store(Out + bh * T * S + qi * S + kj, scale, mask=(qi < T) & (kj < S))


def kernel_dropout_mask(seed, b, h, t, s, p):
    """The kernels' dropout multipliers ``[B,H,T,S]`` for ``seed`` (float32)."""
    out = torch.empty(b, h, t, s)
    _dropout_mask_kernel[(b * h,)](out, seed, h, t, s, p, BLOCK_T=triton.next_power_of_2(t),
                                   BLOCK_S=triton.next_power_of_2(s))
    return out


def test_triton_dropout_matches_eager_with_the_kernels_mask():
    """Dropout p = 0.3: values and gradients equal the eager computation with the kernel's own mask (materialised
    by a helper kernel from the same seed, which torch.manual_seed reproduces); the mask keeps 1 - p of the pairs,
    scaled by 1 / (1 - p), and differs between heads."""
    p, (b, h, t, s) = 0.3, (2, 2, 37, 40)
    keep = KeepMask(t, s, padding(s), causal=True, offset=s - t)
    q, k, v = leaves(b, h, t, s, 16)
    torch.manual_seed(11)
    got = values_and_grads(lambda q, k, v: tr.triton_relu_attention(q, k, v, keep, dropout=p, stats=True), q, k, v,
                           True)
    torch.manual_seed(11)
    drop = kernel_dropout_mask(tr.draw_seed(q.device), b, h, t, s, p)
    kept = drop > 0
    assert torch.allclose(drop[kept], torch.tensor(1 / (1 - p)))
    assert abs(kept.float().mean().item() - (1 - p)) < 0.02  # 5920 draws: 3 sigma = 0.018
    assert not torch.equal(kept[0, 0], kept[0, 1])
    want = values_and_grads(lambda q, k, v: reference(q, k, v, keep, "relu", drop), q, k, v, True)
    assert_close_all(got, want, NAMES, **FP32_TOL)
    torch.manual_seed(11)  # the same step again: the same values
    again = tr.triton_relu_attention(q, k, v, keep, dropout=p)[0]
    assert torch.equal(again.detach().double(), got[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_half_precision_matches_float32_eager(dtype):
    """bfloat16 / float16 inputs: output in that dtype, values and gradients within the dtype's rounding of the
    float64 eager path on the same (rounded) inputs. (The interpreter runs the half-precision dots in numpy float32
    and rounds the product: what a GPU's float32-accumulating tl.dot gives, up to summation order.)"""
    keep = KeepMask(40, 40, padding(40), causal=True)
    q, k, v = leaves(2, 1, 40, 40, 32, dtype=dtype)
    kernel = lambda q, k, v: tr.triton_relu_attention(q, k, v, keep, stats=True)  # noqa: E731
    assert kernel(q, k, v)[0].dtype == dtype
    got = values_and_grads(kernel, q, k, v, True)
    want = values_and_grads(lambda q, k, v: reference(q, k, v, keep, "relu"), q, k, v, True)
    assert_close_all(got, want, NAMES, rtol=2e-2, atol=2e-2)


def test_triton_autocast_runs_in_the_autocast_dtype():
    """Under autocast float32 q, k, v run as the eager matmuls would, in the autocast dtype (bfloat16 on CPU)."""
    keep = KeepMask(8, 8, causal=True)
    q, k, v = leaves(1, 1, 8, 8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tr.triton_relu_attention(q, k, v, keep)[0]
    assert out.dtype == torch.bfloat16
    want = reference(*(x.detach().bfloat16() for x in (q, k, v)), keep, "relu")[0]
    torch.testing.assert_close(out.double(), want, rtol=2e-2, atol=2e-2)


def test_triton_supports_names_its_limits():
    """A dense explicit mask, float64 or a head dim over 128 keep the eager path; called anyway, one clear error."""
    q = torch.zeros(1, 1, 4, 16)
    assert tr.triton_supports(q, q, KeepMask(4, 4, causal=True))
    assert not tr.triton_supports(q, q, KeepMask.from_dense(torch.ones(1, 1, 4, 4, dtype=torch.bool)))
    assert not tr.triton_supports(q.double(), q, KeepMask(4, 4))
    wide = torch.zeros(1, 1, 4, 160)
    assert not tr.triton_supports(wide, wide, KeepMask(4, 4))
    with pytest.raises(ValueError, match="head dim 160"):
        tr.triton_relu_attention(wide, wide, wide, KeepMask(4, 4))
    with pytest.raises(ValueError, match="need activation='relu'"):
        tr.triton_relu_attention(q, q, q, KeepMask(4, 4), activation="gelu", stats=True)


def model_loss_and_grads(preset, monkeypatch, mode):
    """A tiny Marian's training loss (with ReLUFormer's L_reg) and parameter gradients, kernels forced to ``mode``."""
    monkeypatch.setenv(KERNELS_ENV, mode)
    # one layer per stack, 2 heads, 2 sentences (the interpreter is slow); dropout 0 in the tiny config
    model = tiny_model("marian", preset, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2).train()
    out = model(**tiny_batch(batch=2))
    loss = out.loss  # (reluformer: cross-entropy + the weighted L_reg, `aux_loss`)
    assert preset != "reluformer" or out.aux_loss is not None
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return loss.detach(), grads


@pytest.mark.parametrize("preset", ["rela-g", "reluformer"])
def test_triton_model_loss_and_gradients_match_eager(preset, monkeypatch):
    """A tiny rela-g / reluformer Marian (encoder, causal decoder and cross-attention; padded batch): the loss and
    every parameter's gradient with HF_ATTN_KERNELS=triton equal the eager ones; the kernel really ran."""
    calls = []
    for module in (attention_rela, attention_reluformer):
        monkeypatch.setattr(module, "triton_relu_attention",
                            lambda *a, **kw: calls.append(1) or tr.triton_relu_attention(*a, **kw))
    eager_loss, eager_grads = model_loss_and_grads(preset, monkeypatch, "eager")
    assert not calls
    loss, grads = model_loss_and_grads(preset, monkeypatch, "triton")
    assert len(calls) == 3  # encoder and decoder self-attention, cross-attention
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, eager_grads):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
