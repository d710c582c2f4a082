"""Block-wise ReLU-family attention for long inputs: linear memory, the values and gradients of the full computation.

The ReLU family (ReLA, Zhang et al. 2021 Eq. 3; ReLUFormer, Shen et al. 2023 Eq. 5-6) has no softmax normaliser:

    o_i = sum_j dropout(a_ij) v_j,   a_ij = act(c_i q_i k_j^T) * keep_ij        (c: the score scale)

so the output is a plain sum over blocks of keys, and so are ReLUFormer's row statistics for L_reg (Eq. 7):
``sum_j a_ij`` and ``sum_j a_ij log a_ij``. `blockwise_relu_attention` walks blocks of ``chunk`` queries x ``chunk``
keys and adds each block's share; causal blocks above the diagonal are skipped. The backward pass recomputes each
block's scores instead of storing them, so only one ``[B, H, chunk, chunk]`` block of intermediates is alive at a
time (the full computation keeps several ``[B, H, T, S]`` ones). When one block covers every query and key (short
inputs; ReLUFormer's training passes), the backward pass keeps that block's weights instead of recomputing them.
Attention dropout draws each block's mask from its own generator, seeded from one seed drawn per call from torch's
global RNG: the backward pass regenerates exactly the masks the forward pass used, and `torch.manual_seed` makes a
training step reproducible.

Memory: a block-wise pass keeps for backward what SDPA keeps, q, k, v as the caller gave them (the head-split
projections: transposed views, not copies); the scale c (ReLA's 1/sqrt(dh), ReLUFormer's per-query factor) is applied
to each block's query rows as they are gathered, so there is no scaled copy of q either. Each block's rows of q, k, v
(and of the incoming gradient) are gathered into buffers that all blocks of a pass reuse (the copy costs a few per
cent of the block's matmuls; a matmul on the strided slices would copy them itself, into fresh memory), and the sums
over blocks (output, dq, dk, dv) are laid out ``[B, T, H, dh]`` as the projections are, so merging the heads and
handing the gradients back to the projections are views. Forward + backward of one call at 2,048 tokens (B 2, H 4,
dh 64, float32, CPU) peaks 2.5 MiB above SDPA's 21 MiB; with full copies of q, k, v, fresh tensors per block and
``[B, H, T, dh]`` sums it peaked 22 MiB above, and on the CPU the fresh megabytes of block after block also landed on
new heap pages, which the process keeps. (The one-block path of short inputs keeps its contiguous, scaled copies.)
"""

from __future__ import annotations

import math
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
                             float32=False, stats=False, scale=None):
    """``sum_j dropout(act(c q k_j^T) * keep_j) v_j`` over key blocks, for query blocks of ``chunk`` rows.

    q ``[B,H,T,dh]``, k/v ``[B,H,S,dh]``, keep a `KeepMask`. ``scale`` c: a number or a ``[B|1, H|1, T, 1]`` tensor
    (ReLUFormer's per-query factor), applied to the query rows of each block; None: q comes scaled. ``float32``: the
    weights in float32 (under autocast too). Returns (context ``[B,H,T,dh]``, laid out ``[B,T,H,dh]``; row sums or
    None, row sums of a log a or None): the float32 ``[B,H,T]`` statistics only with ``stats``.
    """
    if stats and activation != "relu":
        raise ValueError(f"the block-wise row statistics (ReLUFormer's L_reg) need activation='relu', not {activation!r}")
    if isinstance(scale, torch.Tensor) and scale.requires_grad:  # (its gradient: autograd's, through the product)
        q, scale = q * scale, None
    seed = int(torch.randint(0, 2**62, ()).item()) if dropout > 0 else 0
    out, total, s_log_s = _BlockwiseReluAttention.apply(
        q, k, v, scale, keep, BlockOptions(activation, slope, dropout, chunk, float32 or stats, stats, seed)
    )
    return out, (total if stats else None), (s_log_s if stats else None)


def _query_blocks(keep, q_len: int, k_len: int, chunk: int):
    """(q0, q1, [(index, k0, k1) of every key block these queries may see into]) per block of queries that sees
    any key; ``index`` numbers all blocks row by row, hidden ones included (the seeds of their dropout masks)."""
    per_row = -(-k_len // chunk)
    for row, q0 in enumerate(range(0, q_len, chunk)):
        q1 = min(q0 + chunk, q_len)
        keys = [(row * per_row + col, k0, min(k0 + chunk, k_len)) for col, k0 in enumerate(range(0, k_len, chunk))
                if not keep.block_hidden(q0, q1, k0)]
        if keys:
            yield q0, q1, keys


def _single(queries, q_len: int, k_len: int) -> bool:
    """True when one block covers every query and key (short inputs)."""
    return len(queries) == 1 and queries[0][:2] == (0, q_len) and queries[0][2] == [(0, 0, k_len)]


def _rows(scale, q0: int, q1: int):
    """The scale of queries ``q0:q1``: a number as it is, a ``[B|1, H|1, T, 1]`` tensor's rows."""
    return scale[:, :, q0:q1] if isinstance(scale, torch.Tensor) else scale


def _wide(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if it is a floating type of 32 bits or more, else float32 (torch.promote_types with float32, without
    a call the profiler and the operator counts see)."""
    return dtype if dtype.is_floating_point and dtype.itemsize >= 4 else torch.float32


def _heads_last(b: int, h: int, t: int, d: int, dtype, device) -> torch.Tensor:
    """Zeros ``[B,H,T,d]`` laid out ``[B,T,H,d]``, as the head-split projections are (merging heads: a view)."""
    return torch.zeros(b, t, h, d, dtype=dtype, device=device).transpose(1, 2)


def _dropout_mask(shape, p: float, seed: int, device, dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """F.dropout's mask for one block (keep with probability 1 - p, scaled by 1 / (1 - p)), from its own seed; in
    ``out`` when given."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    mask = torch.empty(shape, device=device, dtype=dtype) if out is None else out
    return mask.bernoulli_(1.0 - p, generator=gen).div_(1.0 - p)


class _Scratch:
    """Block-sized buffers, one per role (a block's query rows, keys, scores, ...), reused by every block of a pass
    (module docstring). ``reuse=False`` (the one-block path, whose block tensors are results or kept for
    backward): fresh tensors from the plain operators (fewest calls: short inputs), except the log's temporary."""

    def __init__(self, reuse: bool = True):
        self.reuse = reuse
        self.buffers: dict[str, torch.Tensor] = {}

    def take(self, role: str, shape, dtype, device, always: bool = False) -> torch.Tensor:
        """An uninitialised ``shape`` tensor: the buffer of ``role`` (grown when too small) when reusing or
        ``always``, else a fresh one."""
        if not (self.reuse or always):
            return torch.empty(shape, dtype=dtype, device=device)
        n = math.prod(shape)
        buffer = self.buffers.get(role)
        if buffer is None or buffer.numel() < n or buffer.dtype != dtype:
            buffer = self.buffers[role] = torch.empty(n, dtype=dtype, device=device)
        return buffer[:n].view(shape)

    def gather(self, role: str, x: torch.Tensor, scale=None) -> torch.Tensor:
        """``x`` (rows of q, k, v: a strided slice) times ``scale`` (None: 1) as one contiguous tensor."""
        if not self.reuse:  # fresh tensors: the fewest operators (short inputs, where they cost most of the time)
            return x.contiguous() if scale is None else (x * scale).contiguous()
        if scale is None and x.is_contiguous():
            return x
        out = self.take(role, x.shape, x.dtype, x.device).copy_(x)  # then scaled in place (under torch.compile,
        # mul's out= would take a strided x's strides)
        return out if scale is None else out.mul_(scale)

    def cast(self, role: str, x: torch.Tensor, dtype) -> torch.Tensor:
        """``x`` in ``dtype`` (x itself if it is already)."""
        if x.dtype == dtype or not self.reuse:
            return x.to(dtype)
        return self.take(role, x.shape, dtype, x.device).copy_(x)

    def matmul(self, role: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The batched product ``a @ b``."""
        if not self.reuse:
            return torch.matmul(a, b)
        return torch.matmul(a, b, out=self.take(role, (*a.shape[:-1], b.shape[-1]), a.dtype, a.device))

    def row_sums(self, role: str, x: torch.Tensor) -> torch.Tensor:
        """``x.sum(-1)``."""
        if not self.reuse:
            return x.sum(-1)
        return torch.sum(x, -1, out=self.take(role, x.shape[:-1], x.dtype, x.device))

    def log_of(self, a: torch.Tensor) -> torch.Tensor:
        """log a, with a clamped away from 0 first (tiny log tiny ~ -7e-29 stands for 0 log 0 = 0; log takes a slow
        path on zeros, ~9x a normal log over a block). log, then a product, is ~2x faster than `torch.xlogy` here."""
        return torch.clamp(a, min=_TINY, out=self.take("log", a.shape, a.dtype, a.device, always=True)).log_()


def _scores(q, k, keep, q0, q1, k0, k1, opts, scratch):
    """(x = q k^T, a = act(x) * keep, the block's mask or None) of one block: q its query rows (scaled), k its keys.
    relu runs in place (a is x): its backward reads a alone."""
    x = scratch.matmul("scores", q, k.transpose(-1, -2))
    if opts.float32:
        x = scratch.cast("scores32", x, _wide(x.dtype))
    a = x.relu_() if opts.activation == "relu" else activate(x, opts.activation, opts.slope)
    mask = keep.block(q0, q1, k0, k1, device=q.device)
    return x, (a if mask is None else a.mul_(mask)), mask


def _dropped(a, opts, index, scratch):
    """(dropout(a), its mask) of block ``index``, the mask regenerated from the block's seed; (a, None) without
    dropout."""
    if opts.dropout <= 0:
        return a, None
    mask = _dropout_mask(a.shape, opts.dropout, opts.seed + index, a.device, a.dtype,
                         out=scratch.take("drop", a.shape, a.dtype, a.device))
    return torch.mul(a, mask, out=scratch.take("dropped", a.shape, a.dtype, a.device)), mask


def _block_outputs(a, v, opts, index, scratch):
    """(dropout(a) v, and with stats the row sums sum_j a_ij and sum_j a_ij log a_ij (Shen et al. 2023 Eq. 7),
    else None, None) of one block: a its weights, v its keys' values."""
    out = scratch.matmul("values", scratch.cast("weights", _dropped(a, opts, index, scratch)[0], v.dtype), v)
    if not opts.stats:
        return out, None, None
    return out, scratch.row_sums("total", a), scratch.row_sums("s_log_s", scratch.log_of(a).mul_(a))


def _block_grads(q, k, v, x, a, mask, grads, opts, index, scratch):
    """(dq, dk, dv or None) of one block: q, k, v its rows and keys (q scaled), x its scores, a = act(x) * keep,
    grads the incoming gradients of its rows (output, row sums, row sums of a log a; each may be None)."""
    grad_out, grad_total, grad_s_log_s = grads
    grad_v = None
    if grad_out is not None:
        dropped, drop = _dropped(a, opts, index, scratch)
        grad_v = scratch.matmul("grad_v", scratch.cast("weights", dropped, v.dtype).transpose(-1, -2), grad_out)
        grad_a = scratch.cast("grad_a32", scratch.matmul("grad_a", grad_out, v.transpose(-1, -2)), a.dtype)
        if drop is not None:
            grad_a.mul_(drop)
    else:
        grad_a = scratch.take("grad_a32", a.shape, a.dtype, a.device).zero_()
    if opts.stats and (grad_total is not None or grad_s_log_s is not None):
        # d sum_j a_ij / da_ij = 1 and d sum_j a_ij log a_ij / da_ij = log a_ij + 1 (a > 0; relu zeroes the
        # rest): the per-row terms in one pass, then the log
        grad_a.add_(sum(t[..., None] for t in (grad_total, grad_s_log_s) if t is not None))
        if grad_s_log_s is not None:
            grad_a.addcmul_(scratch.log_of(a), grad_s_log_s[..., None])
    grad_x = activation_backward(grad_a, x, a, opts.activation, opts.slope)
    if mask is not None and opts.activation != "relu":  # relu: a, hence its gradient, is already 0 there
        grad_x.mul_(mask)
    grad_x = scratch.cast("grad_x", grad_x, q.dtype)
    return scratch.matmul("grad_q", grad_x, k), scratch.matmul("grad_k", grad_x.transpose(-1, -2), q), grad_v


class _BlockwiseReluAttention(torch.autograd.Function):
    """Forward and backward over blocks; the backward recomputes each block's scores (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, scale, keep, opts):
        b, h, t, _ = q.shape
        queries = list(_query_blocks(keep, t, k.shape[2], opts.chunk))
        scale_tensor = scale if isinstance(scale, torch.Tensor) else None  # (saved below; a number stays on ctx)
        ctx.keep, ctx.opts, ctx.scale = keep, opts, None if scale_tensor is not None else scale
        ctx.set_materialize_grads(False)
        if _single(queries, t, k.shape[2]):  # short inputs: one block, whose weights backward keeps (no recompute)
            fresh = _Scratch(reuse=False)  # (its q, k, v, scaled and contiguous, are kept too: short inputs)
            q, k, v = fresh.gather("q", q, scale), fresh.gather("k", k), fresh.gather("v", v)
            x, a, mask = _scores(q, k, keep, 0, t, 0, k.shape[2], opts, fresh)
            out, total, s_log_s = _block_outputs(a, v, opts, 0, fresh)
            ctx.save_for_backward(q, k, v, scale_tensor, a, None if x is a else x, mask)
            return out, (total if opts.stats else q.new_zeros(0)), (s_log_s if opts.stats else q.new_zeros(0))
        wide = _wide(q.dtype)  # accumulators: float32 at least
        out = _heads_last(b, h, t, v.shape[-1], wide, q.device)
        # the two row sums share one allocation (one block of memory kept for L_reg's backward, not two)
        if opts.stats:
            total, s_log_s = torch.zeros(2, b, h, t, dtype=wide, device=q.device)
        else:
            total, s_log_s = q.new_zeros(0), q.new_zeros(0)
        scratch = _Scratch()
        for q0, q1, keys in queries:
            rows = scratch.gather("q", q[:, :, q0:q1], _rows(scale, q0, q1))
            for index, k0, k1 in keys:
                _, a, _ = _scores(rows, scratch.gather("k", k[:, :, k0:k1]), keep, q0, q1, k0, k1, opts, scratch)
                part, part_total, part_s_log_s = _block_outputs(a, scratch.gather("v", v[:, :, k0:k1]), opts, index,
                                                                scratch)
                out[:, :, q0:q1] += part
                if opts.stats:
                    total[:, :, q0:q1] += part_total
                    s_log_s[:, :, q0:q1] += part_s_log_s
        ctx.save_for_backward(q, k, v, scale_tensor, None, None, None)
        return out.to(v.dtype), total, s_log_s

    @staticmethod
    def backward(ctx, grad_out, grad_total, grad_s_log_s):
        q, k, v, scale_tensor, kept, kept_x, kept_mask = ctx.saved_tensors
        keep, opts = ctx.keep, ctx.opts
        scale = scale_tensor if scale_tensor is not None else ctx.scale
        # (without stats the row sums are empty placeholders; a compiled graph may hand them zero gradients)
        grads = (grad_out, grad_total, grad_s_log_s) if opts.stats else (grad_out, None, None)
        if kept is not None:  # one block, its weights and mask kept by forward
            fresh = _Scratch(reuse=False)
            grad_rows = (None if grad_out is None else fresh.gather("grad_out", grad_out), *grads[1:])
            dq, dk, dv = _block_grads(q, k, v, kept_x if kept_x is not None else kept, kept, kept_mask, grad_rows,
                                      opts, 0, fresh)
        else:
            dq, dk, dv = _BlockwiseReluAttention._sum_block_grads(q, k, v, scale, keep, grads, opts)
        if scale is not None:  # d (c q) / dq = c
            dq.mul_(scale)
        return dq.to(q.dtype), dk.to(k.dtype), None if dv is None else dv.to(v.dtype), None, None, None

    @staticmethod
    def _sum_block_grads(q, k, v, scale, keep, grads, opts):
        """(dq, dk, dv) summed over the blocks, each block's scores recomputed; dq of the scaled q."""
        wide = _wide(q.dtype)  # accumulators: float32 at least
        dq, dk, dv = (_heads_last(*x.shape, wide, x.device) for x in (q, k, v))
        scratch = _Scratch()
        for q0, q1, keys in _query_blocks(keep, q.shape[2], k.shape[2], opts.chunk):
            rows = scratch.gather("q", q[:, :, q0:q1], _rows(scale, q0, q1))
            grad_out = None if grads[0] is None else scratch.gather("grad_out", grads[0][:, :, q0:q1])
            grad_rows = (grad_out, *(None if g is None else g[:, :, q0:q1] for g in grads[1:]))
            for index, k0, k1 in keys:
                keys_k, keys_v = scratch.gather("k", k[:, :, k0:k1]), scratch.gather("v", v[:, :, k0:k1])
                x, a, mask = _scores(rows, keys_k, keep, q0, q1, k0, k1, opts, scratch)
                grad_q, grad_k, grad_v = _block_grads(rows, keys_k, keys_v, x, a, mask, grad_rows, opts, index,
                                                      scratch)
                dq[:, :, q0:q1] += grad_q
                dk[:, :, k0:k1] += grad_k
                if grad_v is not None:
                    dv[:, :, k0:k1] += grad_v
        return dq, dk, dv
