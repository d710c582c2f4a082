"""ReLA (Zhang, Titov & Sennrich 2021; hf_attn/modeling/attention_rela.py): null rows give zeros, never NaN, in every
dtype; the norm runs in float32 under autocast; rela-i's gain and rela-g's gate start in the paper's ranges; and the
training memory: ``out_proj(LN(o))`` keeps o alone for backward (`NormThenProject`), as softmax attention keeps o for
its out_proj, and gives plain autograd's values and gradients.

The preset contract is in tests/test_presets.py, the returned weights in tests/contract/, the block-wise path for long
inputs in test_blockwise.py."""

from __future__ import annotations

import pytest
import torch
from conftest import attention_context, tiny_model
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hf_attn.modeling.masking import KeepMask

ReLA_NORMED = ["rela-g", "rela-i", "rela-g-layernorm"]


@pytest.mark.parametrize("preset", ["rela-g", "rela-i", "rela-g-layernorm", "relu-rmsnorm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rela_null_rows_give_zeros_not_nan(preset, dtype):
    model = tiny_model("marian", preset).to(dtype)
    module = model.model.decoder.layers[0].encoder_attn
    q = -torch.ones(2, 4, 3, 8, dtype=dtype)  # every score negative -> ReLU -> all-null rows
    k = torch.ones(2, 4, 6, 8, dtype=dtype)
    v = torch.randn(2, 4, 6, 8).to(dtype)
    keep = KeepMask.from_dense(torch.ones(2, 1, 3, 6, dtype=torch.bool))
    ctx, weights = module.attend(q, k, v, keep, attention_context(True))
    assert (weights == 0).all() and (ctx == 0).all()
    merged = module.normalise(ctx.transpose(1, 2).reshape(2, 3, 32))
    assert torch.isfinite(merged).all()
    if preset != "rela-g-layernorm":  # LayerNorm adds its bias (zero at init)
        assert (merged == 0).all()


def test_rela_norm_runs_in_float32_under_autocast():
    model = tiny_model("marian", "rela-g")
    module = model.model.encoder.layers[0].self_attn
    o = torch.randn(2, 3, 32).bfloat16() * 1e-3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = module.normalise(o)
    z = o.float()
    ref = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-8) * torch.sigmoid(module.rela_gate_weight * z)
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)


def test_rela_i_gain_init_is_uniform_in_the_papers_range():
    model = tiny_model("marian", "rela-i")
    gain = model.model.encoder.layers[0].self_attn.rela_gain
    bound = (3 / 8) ** 0.5  # dh = 32 / 4
    assert gain.abs().max() <= bound and gain.std() > 0.1 * bound
    gate = tiny_model("marian", "rela-g").model.encoder.layers[0].self_attn.rela_gate_weight
    assert gate.abs().max() <= (3 / 32) ** 0.5 and gate.std() > 0


class NewStorages(TorchDispatchMode):
    """Every storage the ops run under it create; `held_bytes` sums those still alive afterwards (kept by the autograd
    graph, or by the tensors named in ``exclude``, which are left out)."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        storages = [t.untyped_storage() for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.made += [(StorageWeakRef(s), s.nbytes()) for s in storages]
        return out

    def held_bytes(self, exclude) -> int:
        skip = {StorageWeakRef(t.untyped_storage()).cdata for t in exclude}
        alive = {ref.cdata: size for ref, size in self.made if not ref.expired() and ref.cdata not in skip}
        return sum(alive.values())


def bytes_kept_for_backward(preset: str, autocast: bool) -> int:
    """What one encoder self-attention forward (x [2, 16, 32], gradients on) leaves alive for its backward."""
    module = tiny_model("marian", preset).model.encoder.layers[0].self_attn
    x = torch.randn(2, 16, 32, requires_grad=True)
    with NewStorages() as new, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, _ = module(x)
    assert out.requires_grad
    return new.held_bytes(exclude=[x, out, *module.parameters()])


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_rela_keeps_no_more_for_backward_than_relu(autocast):
    """ReLA's norm adds no [B,T,d] tensor to what ReLU attention without a norm keeps (here 4 KiB each in float32)."""
    relu = bytes_kept_for_backward("relu", autocast)
    assert relu >= 2 * 16 * 32 * (2 if autocast else 4)  # o, kept for out_proj's weight gradient, at least
    for preset in ReLA_NORMED:
        assert bytes_kept_for_backward(preset, autocast) <= relu, preset


@pytest.mark.parametrize("frozen", [False, True], ids=["all-trained", "some-frozen"])
@pytest.mark.parametrize("preset", ReLA_NORMED)
def test_rela_fused_out_projection_equals_plain_autograd(preset, frozen):
    """`project_out` (training: one NormThenProject node) against out_proj(normalise(o)) through plain autograd:
    values and the gradients of o and of every parameter (out_proj's bias included)."""
    module = tiny_model("marian", preset).model.encoder.layers[0].self_attn
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # no parameter at its init (zero biases, unit gains)
    if frozen:
        module.out_proj.weight.requires_grad_(False)
        module.rela_gain.requires_grad_(False)
    o = torch.randn(2, 5, 32, requires_grad=not frozen)
    o.data[0, 1] = 0.0  # a null-attention row
    upstream = torch.randn(2, 5, 32)
    inputs = (o, *module.out_proj.parameters(), *module.norm_params())
    trained = [t for t in inputs if t is not None and t.requires_grad]
    fused = module.project_out(o)
    assert type(fused.grad_fn).__name__ == "NormThenProjectBackward"
    plain = module.out_proj(module.normalise(o))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(torch.autograd.grad(fused, trained, upstream), torch.autograd.grad(plain, trained, upstream)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rela_fused_out_projection_under_autocast_matches_plain_autograd():
    """bf16 autocast: LN in float32, out_proj in bf16, gradients in the parameters' dtype, as plain autograd gives."""
    module = tiny_model("marian", "rela-g").model.encoder.layers[0].self_attn
    o = torch.randn(2, 5, 32).bfloat16().requires_grad_()
    upstream = torch.randn(2, 5, 32).bfloat16()
    trained = [o, *module.out_proj.parameters(), *(p for p in module.norm_params() if p is not None)]
    grads = []
    for fuse in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = module.project_out(o) if fuse else module.out_proj(module.normalise(o))
        assert out.dtype == torch.bfloat16
        grads.append((out, *torch.autograd.grad(out, trained, upstream)))
    for got, want in zip(*grads):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
