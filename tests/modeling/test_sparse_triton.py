"""AdaSplash's Triton entmax (the ``[gpu]`` extra) against the `entmax` package, under Triton's interpreter on CPU:
sparsemax (alpha 2) and 1.5-entmax values and gradients on attention-shaped scores with masked keys, and when the
sparse variants dispatch to it (hf_attn/modeling/attention_softmax.py).

AdaSplash targets CUDA: its kernels call three CUDA libdevice functions (`isinf`, `float2int_rd`, `fast_powf`, the
last only with fast_math) and autotune their block size, which the interpreter has none of. `interpretable_adasplash`
gives its module stand-ins with the same semantics for the duration of a test (|x| == inf; floor to int32; one block
size); the model itself uses AdaSplash on CUDA tensors only."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_context, tiny_model

from hf_attn.modeling import attention_softmax as sm
from hf_attn.modeling.masking import KeepMask

adasplash_v2 = pytest.importorskip("adasplash.triton_entmax_v2", reason="the [gpu] extra (adasplash) is not installed")
entmax = pytest.importorskip("entmax")
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
# the interpreter's numpy casts of the masked (-inf) lanes, which the kernels then discard
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


@triton.jit
def _isinf(x):
    return tl.abs(x) == float("inf")


@triton.jit
def _float2int_rd(x):
    return tl.floor(x).to(tl.int32)


class _OneBlockSize:
    """``kernel[grid](...)`` with the block size the autotuner would pick (the interpreter skips autotuning)."""

    def __init__(self, kernel, block: int = 32):
        self.kernel, self.block = kernel, block

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, BLOCK_N=self.block, **kwargs)


@pytest.fixture
def interpretable_adasplash(monkeypatch):
    monkeypatch.setattr(adasplash_v2, "isinf", _isinf)
    monkeypatch.setattr(adasplash_v2, "float2int_rd", _float2int_rd)
    monkeypatch.setattr(adasplash_v2, "_fwd_entmax", _OneBlockSize(adasplash_v2._fwd_entmax))
    monkeypatch.setattr(adasplash_v2, "_bwd_entmax", _OneBlockSize(adasplash_v2._bwd_entmax))


@pytest.mark.parametrize(("alpha", "reference"), [(2.0, "sparsemax"), (1.5, "entmax15")])
def test_adasplash_triton_entmax_equals_the_entmax_package(interpretable_adasplash, alpha, reference):
    """Scores as the variants build them: [B, H, T, S] float32, hidden keys filled with MASKED_SCORE (padding and a
    causal pattern); values and the gradient of the scores, to float32 rounding."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 2, 5, 37, generator=g) * 3
    keep = torch.ones(2, 1, 5, 37, dtype=torch.bool)
    keep[1, ..., 30:] = False  # padded keys
    keep[0, 0] = torch.arange(37)[None, :] <= torch.arange(5)[:, None] + 20  # a causal-like pattern
    scores = scores.masked_fill(~keep, sm.MASKED_SCORE)
    upstream = torch.randn(2, 2, 5, 37, generator=g)
    got_x, want_x = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    got = sm.adasplash_normalise(got_x, alpha)
    want = getattr(entmax, reference)(want_x, dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got[~keep.expand_as(got)] == 0).all()
    (got * upstream).sum().backward()
    (want * upstream).sum().backward()
    torch.testing.assert_close(got_x.grad, want_x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["sparsemax", "entmax15"])
def test_sparse_variants_use_adasplash_on_cuda_tensors_only(monkeypatch, preset):
    """The dispatch: CPU tensors (any kernel mode) and ``output_attentions`` keep the `entmax` package's path."""
    module = tiny_model("marian", preset).model.encoder.layers[0].self_attn
    calls = []
    monkeypatch.setattr(sm, "adasplash_normalise", lambda scores, alpha: calls.append(alpha))
    monkeypatch.setenv("HF_ATTN_KERNELS", "triton")
    q, k, v = (torch.randn(2, 4, 6, 8, requires_grad=True) for _ in range(3))
    keep = KeepMask(6, 6, padding=torch.tensor([[True] * 6, [True] * 4 + [False] * 2]))
    out, _ = module.attend(q, k, v, keep, attention_context(False))
    assert calls == [] and torch.isfinite(out).all()
    scores = torch.randn(2, 4, 6, 6)
    assert module.normalise(scores, need_weights=False).shape == scores.shape and calls == []
