"""ReLA's training memory: ``out_proj(LN(o))`` keeps o alone for backward (`NormThenProject`), as softmax attention
keeps o for its out_proj, and gives plain autograd's values and gradients."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ReLA_NORMED = ["rela-g", "rela-i", "rela-g-layernorm"]


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
