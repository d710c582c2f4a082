"""Block-wise ReLU-family attention for long inputs: linear memory, the values and gradients of the full computation.

The ReLU family (ReLA, Zhang et al. 2021 Eq. 3; ReLUFormer, Shen et al. 2023 Eq. 5-6) has no softmax normaliser:

    o_i = sum_j dropout(a_ij) v_j,   a_ij = act(q_i k_j^T) * keep_ij        (q already scaled)

so the output is a plain sum over blocks of keys, and so are ReLUFormer's row statistics for L_reg (Eq. 7):
``sum_j a_ij`` and ``sum_j a_ij log a_ij``. `blockwise_relu_attention` walks blocks of ``chunk`` queries x ``chunk``
keys and adds each block's share; causal blocks above the diagonal are skipped. The backward pass recomputes each
block's scores instead of storing them, so only one ``[B, H, chunk, chunk]`` block of intermediates is alive at a
time (the full computation keeps several ``[B, H, T, S]`` ones). When one block covers every query and key (short
inputs; ReLUFormer's training passes), the backward pass keeps that block's weights instead of recomputing them.
Attention dropout draws each block's mask from its own generator, seeded from one seed drawn per call from torch's
global RNG: the backward pass regenerates exactly the masks the forward pass used, and `torch.manual_seed` makes a
training step reproducible.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

ACTIVATIONS = ("relu", "gelu", "leaky_relu")
_TINY = 1e-30  # log a reads log(max(a, tiny)): log is slow on zeros; relu zeroes the gradient where a = 0


def activate(x: torch.Tensor, activation: str, slope: float = 0.01, inplace: bool = False) -> torch.Tensor:
    """relu / gelu (exact, erf) / leaky_relu(slope); relu and leaky_relu on ``x`` itself when ``inplace``."""
    if activation == "relu":
        return F.relu(x, inplace=inplace)
    if activation == "gelu":
        return F.gelu(x)
    return F.leaky_relu(x, slope, inplace=inplace)


def activation_backward(grad: torch.Tensor, x: torch.Tensor, a: torch.Tensor, activation: str,
                        slope: float = 0.01) -> torch.Tensor:
    """``grad * d act / dx``, in place on ``grad``, with the ATen kernels autograd itself uses (0 at x = 0 for
    relu, ``slope`` for leaky_relu). relu reads ``a`` = relu(x), possibly times a 0/1 mask (its gradient is then 0
    on hidden keys too); leaky_relu and gelu read ``x``."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward.grad_input(grad, a, 0, grad_input=grad)
    if activation == "leaky_relu":
        return torch.ops.aten.leaky_relu_backward.grad_input(grad, x, slope, False, grad_input=grad)
    return torch.ops.aten.gelu_backward.grad_input(grad, x, grad_input=grad)


class BlockOptions(NamedTuple):
    """The settings of one block-wise call (`blockwise_relu_attention`), which its backward pass reads again."""

    activation: str  # relu / gelu / leaky_relu (`activate`)
    slope: float  # leaky_relu's negative slope
    dropout: float  # attention dropout probability
    chunk: int  # queries and keys per block
    float32: bool  # the weights in float32 (also with ``stats``)
    stats: bool  # also return the row statistics sum_j a_ij and sum_j a_ij log a_ij
    seed: int  # the seed of the blocks' dropout masks (0 without dropout)


def use_blocks(q_len: int, k_len: int, chunk: int, need_weights: bool) -> bool:
    """Run block-wise when a side is longer than ``chunk`` (0 = never) and the weights are not requested."""
    return chunk > 0 and max(q_len, k_len) > chunk and not need_weights


def blockwise_relu_attention(q, k, v, keep, *, activation="relu", slope=0.01, dropout=0.0, chunk=256,
                             float32=False, stats=False):
    """``sum_j dropout(act(q k_j^T) * keep_j) v_j`` over key blocks, for query blocks of ``chunk`` rows.

    q ``[B,H,T,dh]`` (scaled), k/v ``[B,H,S,dh]``, keep a `KeepMask`. ``float32``: the weights in float32 (under
    autocast too). Returns (context ``[B,H,T,dh]``, row sums or None, row sums of a log a or None): the float32
    ``[B,H,T]`` statistics only with ``stats``.
    """
    if stats and activation != "relu":
        raise ValueError(f"the block-wise row statistics (ReLUFormer's L_reg) need activation='relu', not {activation!r}")
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout > 0 else 0
    out, total, s_log_s = _BlockwiseReluAttention.apply(
        q, k, v, keep, BlockOptions(activation, slope, dropout, chunk, float32 or stats, stats, seed)
    )
    return out, (total if stats else None), (s_log_s if stats else None)


def _blocks(keep, q_len: int, k_len: int, chunk: int):
    """(index, q0, q1, k0, k1) of every block that some query may see into."""
    index = 0
    for q0 in range(0, q_len, chunk):
        q1 = min(q0 + chunk, q_len)
        for k0 in range(0, k_len, chunk):
            if not keep.block_hidden(q0, q1, k0):
                yield index, q0, q1, k0, min(k0 + chunk, k_len)
            index += 1


def _single(blocks, q_len: int, k_len: int) -> bool:
    """True when one block covers every query and key (short inputs)."""
    return len(blocks) == 1 and blocks[0][1:] == (0, q_len, 0, k_len)


def _dropout_mask(shape, p: float, seed: int, device, dtype) -> torch.Tensor:
    """F.dropout's mask for one block (keep with probability 1 - p, scaled by 1 / (1 - p)), from its own seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return torch.empty(shape, device=device, dtype=dtype).bernoulli_(1.0 - p, generator=gen).div_(1.0 - p)


class _Scratch:
    """One block-sized buffer reused by every block of a pass (a fresh block each time is a round trip to the OS)."""

    def __init__(self):
        self.buffer = None

    def log_of(self, a: torch.Tensor) -> torch.Tensor:
        """log a in the buffer, with a clamped away from 0 first (tiny log tiny ~ -7e-29 stands for 0 log 0 = 0;
        log takes a slow path on zeros, ~9x a normal log over a block). log, then a product, is ~2x faster than
        `torch.xlogy` here."""
        if self.buffer is None or self.buffer.numel() < a.numel() or self.buffer.dtype != a.dtype:
            self.buffer = torch.empty(a.numel(), dtype=a.dtype, device=a.device)
        out = self.buffer[: a.numel()].view(a.shape)
        return torch.clamp(a, min=_TINY, out=out).log_()


class _BlockwiseReluAttention(torch.autograd.Function):
    """Forward and backward over blocks; the backward recomputes each block's scores (module docstring)."""

    @staticmethod
    def _scores(q, k, keep, q0, q1, k0, k1, opts):
        """(x = q k^T, a = act(x) * keep, the block's mask or None). relu runs in place (a is x): its backward reads
        a alone. In place wherever possible: a block is megabytes, and every fresh one is a round trip to the OS."""
        activation, slope, float32 = opts.activation, opts.slope, opts.float32
        x = torch.matmul(q[:, :, q0:q1], k[:, :, k0:k1].transpose(-1, -2))
        x = x.float() if float32 and x.dtype in (torch.float16, torch.bfloat16) else x
        a = x.relu_() if activation == "relu" else activate(x, activation, slope)
        mask = keep.block(q0, q1, k0, k1, device=q.device)
        return x, (a if mask is None else a.mul_(mask)), mask

    @staticmethod
    def forward(ctx, q, k, v, keep, opts):
        chunk, stats = opts.chunk, opts.stats
        # head-split projections are transposed views: every block's matmul would copy its slices (~10% of the time)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        b, h, t, _ = q.shape
        blocks = list(_blocks(keep, t, k.shape[2], chunk))
        ctx.keep, ctx.opts = keep, opts
        ctx.set_materialize_grads(False)
        if _single(blocks, t, k.shape[2]):  # short inputs: one block, whose weights backward keeps (no recompute)
            x, a, mask = _BlockwiseReluAttention._scores(q, k, keep, 0, t, 0, k.shape[2], opts)
            out, total, s_log_s = _BlockwiseReluAttention._block_outputs(a, v, opts, 0, _Scratch())
            ctx.save_for_backward(q, k, v, a, None if x is a else x, mask)
            return out, (total if stats else q.new_zeros(0)), (s_log_s if stats else q.new_zeros(0))
        wide = torch.promote_types(q.dtype, torch.float32)  # accumulators: float32 at least
        out = torch.zeros(b, h, t, v.shape[-1], dtype=wide, device=q.device)
        total = torch.zeros(b, h, t, dtype=wide, device=q.device) if stats else q.new_zeros(0)
        s_log_s = torch.zeros_like(total)
        scratch = _Scratch()
        for index, q0, q1, k0, k1 in blocks:
            _, a, _ = _BlockwiseReluAttention._scores(q, k, keep, q0, q1, k0, k1, opts)
            part, part_total, part_s_log_s = _BlockwiseReluAttention._block_outputs(a, v[:, :, k0:k1], opts, index,
                                                                                    scratch)
            out[:, :, q0:q1] += part
            if stats:
                total[:, :, q0:q1] += part_total
                s_log_s[:, :, q0:q1] += part_s_log_s
        ctx.save_for_backward(q, k, v, None, None, None)
        return out.to(v.dtype), total, s_log_s

    @staticmethod
    def _block_outputs(a, v, opts, index, scratch):
        """(dropout(a) v, and with stats the row sums sum_j a_ij and sum_j a_ij log a_ij (Shen et al. 2023 Eq. 7),
        else None, None) of one block: a its weights, v its keys' values."""
        dropout, stats, seed = opts.dropout, opts.stats, opts.seed
        dropped = a * _dropout_mask(a.shape, dropout, seed + index, a.device, a.dtype) if dropout > 0 else a
        out = torch.matmul(dropped.to(v.dtype), v)
        if not stats:
            return out, None, None
        return out, a.sum(-1), scratch.log_of(a).mul_(a).sum(-1)

    @staticmethod
    def backward(ctx, grad_out, grad_total, grad_s_log_s):
        q, k, v, kept, kept_x, kept_mask = ctx.saved_tensors
        keep, opts = ctx.keep, ctx.opts
        chunk, stats = opts.chunk, opts.stats
        grad_out = None if grad_out is None else grad_out.contiguous()  # (as q, k, v in forward)
        # (without stats the row sums are empty placeholders; a compiled graph may hand them zero gradients)
        grads = (grad_out, grad_total, grad_s_log_s) if stats else (grad_out, None, None)
        if kept is not None:  # one block, its weights and mask kept by forward
            return (*_BlockwiseReluAttention._block_grads(q, k, v, kept_x if kept_x is not None else kept, kept,
                                                          kept_mask, grads, opts, 0, _Scratch()), None, None)
        wide = torch.promote_types(q.dtype, torch.float32)  # accumulators: float32 at least
        dq, dk, dv = (torch.zeros(x.shape, dtype=wide, device=x.device) for x in (q, k, v))
        scratch = _Scratch()
        for index, q0, q1, k0, k1 in _blocks(keep, q.shape[2], k.shape[2], chunk):
            x, a, mask = _BlockwiseReluAttention._scores(q, k, keep, q0, q1, k0, k1, opts)
            rows = [None if g is None else g[:, :, q0:q1] for g in grads]
            grad_q, grad_k, grad_v = _BlockwiseReluAttention._block_grads(
                q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1], x, a, mask, rows, opts, index, scratch)
            dq[:, :, q0:q1] += grad_q
            dk[:, :, k0:k1] += grad_k
            if grad_v is not None:
                dv[:, :, k0:k1] += grad_v
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None

    @staticmethod
    def _block_grads(q, k, v, x, a, mask, grads, opts, index, scratch):
        """(dq, dk, dv or None) of one block: q, k, v its rows and keys, x its scores, a = act(x) * keep, grads the
        incoming gradients of its rows (output, row sums, row sums of a log a; each may be None)."""
        activation, slope, dropout, stats, seed = opts.activation, opts.slope, opts.dropout, opts.stats, opts.seed
        grad_out, grad_total, grad_s_log_s = grads
        grad_v = None
        if grad_out is not None:
            drop = _dropout_mask(a.shape, dropout, seed + index, a.device, a.dtype) if dropout > 0 else None
            dropped = a if drop is None else a * drop
            grad_v = torch.matmul(dropped.to(v.dtype).transpose(-1, -2), grad_out)
            grad_a = torch.matmul(grad_out, v.transpose(-1, -2)).to(a.dtype)
            if drop is not None:
                grad_a.mul_(drop)
        else:
            grad_a = torch.zeros_like(a)
        if stats and (grad_total is not None or grad_s_log_s is not None):
            # d sum_j a_ij / da_ij = 1 and d sum_j a_ij log a_ij / da_ij = log a_ij + 1 (a > 0; relu zeroes the
            # rest): the per-row terms in one pass, then the log
            grad_a.add_(sum(t[..., None] for t in (grad_total, grad_s_log_s) if t is not None))
            if grad_s_log_s is not None:
                grad_a.addcmul_(scratch.log_of(a), grad_s_log_s[..., None])
        grad_x = activation_backward(grad_a, x, a, activation, slope)
        if mask is not None and activation != "relu":  # relu: a, hence its gradient, is already 0 there
            grad_x.mul_(mask)
        grad_x = grad_x.to(q.dtype)
        return torch.matmul(grad_x, k), torch.matmul(grad_x.transpose(-1, -2), q), grad_v
