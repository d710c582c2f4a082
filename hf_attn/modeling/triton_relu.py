"""Fused Triton kernels (forward and backward) for the ReLU attention family: ReLA (Zhang et al. 2021, Eq. 3) and
ReLUFormer (Shen et al. 2023, Eq. 5-7). Used on CUDA tensors whenever `fused.dispatch` says so.

What: the contract of `attention_blockwise.blockwise_relu_attention` (q scaled by the caller, ReLUFormer's per-query
factor 1 / (gamma sqrt(n_i / 2)) included, or by the kernel's ``scale``):

    a_ij = act(q_i k_j^T) * keep_ij,    o_i = sum_j dropout(a)_ij v_j                 (ReLA Eq. 3; ReLUFormer Eq. 5-6)
    with ``stats``: sum_j a_ij and sum_j a_ij log a_ij per row (float32), the two sums L_reg (Eq. 7) is built from.

How: the ReLU family has no softmax, hence no running max, no exp and no rescaling: o_i is a plain sum over key
tiles. One forward launch: each program takes one query tile of one head and walks the key tiles (``tl.dot`` in the
inputs' dtype, float32 accumulation), adding each tile's share; the row statistics are summed in the same pass. One
backward launch: program i recomputes the scores of key tile i against every query tile (dk, dv), then of query
tile i against every key tile (dq); nothing of size ``[B, H, T, S]`` is ever stored, and only q, k, v (and the
padding mask) are kept for backward. The keep mask is read in its compact form (`KeepMask`: key padding ``[B, S]``
+ causal with an offset = the cache length); causal tiles above the diagonal are skipped. Attention dropout: a
counter-based RNG (Philox keyed by one seed per call, drawn on the device from torch's RNG, so `torch.manual_seed`
reproduces a step; counters = key, query, batch x head), regenerated exactly by the backward pass; no host sync.
Tiles: 128 queries x 64 keys forward, 64 x 64 backward, shrunk for short inputs (`_launch_config`).

Limits (`triton_supports` says when the kernel applies; callers keep the eager path otherwise): a dense
``explicit`` mask, float64 and head dims over 128 are not supported (other head dims are padded to a power of two
>= 16 in registers); the row statistics need activation relu. float32 inputs use IEEE float32 dots (no TF32).
Under Triton's interpreter (CPU tensors, the tests) bfloat16 dot operands are widened to float32, exactly, because
the interpreter's bfloat16 ``tl.dot`` is wrong (triton 3.9).
"""

from __future__ import annotations

import torch

from .fused import interpreting, tl, triton

ACT_CODES = {"relu": 0, "gelu": 1, "leaky_relu": 2}
MAX_HEAD_DIM = 128
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def triton_supports(q: torch.Tensor, k: torch.Tensor, keep) -> bool:
    """True when the fused kernel can run this call: triton importable, a CUDA tensor (or Triton's interpreter), a
    compact keep mask, q in float32 / bfloat16 / float16, non-empty lengths, head dim <= 128."""
    return (triton is not None and (q.is_cuda or interpreting()) and keep.explicit is None
            and q.dtype in DTYPES and q.shape[-1] <= MAX_HEAD_DIM and q.shape[2] > 0 and k.shape[2] > 0
            and (keep.padding is None or keep.padding.shape[-1] == k.shape[2]))


def triton_relu_attention(q, k, v, keep, *, activation="relu", slope=0.01, dropout=0.0, stats=False, scale=1.0):
    """``sum_j dropout(act(q k_j^T) * keep_j) v_j`` in one fused kernel (module docstring).

    q ``[B,H,T,dh]`` (scaled, or times ``scale`` in the kernel: one pass over q saved), k/v ``[B,H,S,dh]``, keep a
    compact `KeepMask`. Returns (context ``[B,H,T,dh]`` in v's dtype, float32 ``[B,H,T]`` row sums or None, row
    sums of a log a or None): the statistics only with ``stats``. Under autocast q, k, v are cast to the autocast
    dtype first (as the eager matmuls would be). log a reads log(max(a, 1e-30)), as `attention_blockwise`.
    """
    if activation not in ACT_CODES:
        raise ValueError(f"activation {activation!r} is not one of {tuple(ACT_CODES)}")
    if stats and activation != "relu":
        raise ValueError(f"the row statistics (ReLUFormer's L_reg) need activation='relu', not {activation!r}")
    if not triton_supports(q, k, keep):
        raise ValueError(f"triton_relu_attention cannot run {q.dtype} head dim {q.shape[-1]} on {q.device} (needs "
                         f"{DTYPES}, head dim <= {MAX_HEAD_DIM}, CUDA or TRITON_INTERPRET=1, no dense explicit mask); "
                         "check triton_supports() first and use the eager path")
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
    else:
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = (x if x.dtype == dtype else x.to(dtype) for x in (q, k, v))
    seed = draw_seed(q.device) if dropout > 0 else None
    opts = (ACT_CODES[activation], float(scale), float(slope), float(dropout), bool(stats), bool(keep.causal),
            int(keep.offset))
    out, total, s_log_s = _TritonReluAttention.apply(q, k, v, keep.padding, seed, opts)
    return out, (total if stats else None), (s_log_s if stats else None)


def draw_seed(device) -> torch.Tensor:
    """The dropout seed of one call (int64 ``[1]``), drawn on ``device`` from torch's RNG: `torch.manual_seed`
    reproduces it, and no host sync is needed (the kernels read it from memory)."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def _launch_config(q: torch.Tensor, s: int):
    """(forward BLOCK_M, BLOCK_N, its num_warps, backward BLOCK, its num_warps, BLOCK_D). GPU: flash-style tiles,
    128 queries x 64 keys forward, 64 x 64 backward (32 x 32 for head dims over 64), shrunk to the next power of two
    of short lengths (a 40-token sentence runs one 64-row tile, not a 128-row one); warps so that sm_90 code keeps
    its tiles in registers (ptxas: no spills without dropout). Interpreter: 32 x 32 tiles (small tests still span
    several ragged tiles)."""
    t, dh = q.shape[2], q.shape[-1]
    block_d = max(16, triton.next_power_of_2(dh))
    if not q.is_cuda:
        return 32, 32, 4, 32, 4, block_d
    fit = lambda n, cap: min(cap, max(16, triton.next_power_of_2(n)))  # noqa: E731
    block_m, block_n, block = fit(t, 128), fit(s, 64), fit(max(t, s), 64 if block_d <= 64 else 32)
    return block_m, block_n, 8 if block_m >= 128 else 4, block, 8 if block * block_d >= 64 * 64 else 4, block_d


def _dot_options(q: torch.Tensor) -> dict:
    """PRECISION: IEEE float32 dots for float32 inputs (no TF32); WIDEN: bfloat16 dot operands widened to float32
    (exact) under the interpreter, whose bfloat16 ``tl.dot`` returns garbage (triton 3.9)."""
    return dict(PRECISION="ieee" if q.dtype == torch.float32 else None,
                WIDEN=q.dtype == torch.bfloat16 and not q.is_cuda)


def _pad_strides(padding):
    """(batch stride, key stride) of the padding mask ``[B|1, S]`` (0 for a broadcast batch; zeros without one)."""
    if padding is None:
        return 0, 0
    return (padding.stride(0) if padding.shape[0] > 1 else 0), padding.stride(1)


def _strides(x: torch.Tensor):
    return x.stride(0), x.stride(1), x.stride(2), x.stride(3)


class _TritonReluAttention(torch.autograd.Function):
    """One forward launch (`_fwd_kernel`), one backward launch (`_bwd_kernel`)."""

    @staticmethod
    def forward(ctx, q, k, v, padding, seed, opts):
        act, scale, slope, p, stats, causal, offset = opts
        b, h, t, dh = q.shape
        s = k.shape[2]
        q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
        pad = padding.view(torch.uint8) if padding is not None else q  # (bool as bytes, no copy; q: a dummy pointer)
        seed = q if seed is None else seed  # (a dummy pointer: read only with dropout)
        block_m, block_n, warps, _, _, block_d = _launch_config(q, s)
        # [B,T,H,dh] memory, returned as its [B,H,T,dh] view: merging the heads afterwards is free
        out = torch.empty(b, t, h, dh, dtype=v.dtype, device=q.device).transpose(1, 2)
        total = torch.empty(b, h, t, dtype=torch.float32, device=q.device) if stats else q.new_zeros(0)
        s_log_s = torch.empty_like(total) if stats else q.new_zeros(0)
        grid = (triton.cdiv(t, block_m), b * h)
        _fwd_kernel[grid](
            q, k, v, out, total, s_log_s, pad, seed, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            *_pad_strides(padding), h, t, s, dh, offset, scale, slope, p,
            ACT=act, CAUSAL=causal, HAS_PAD=padding is not None, DROPOUT=p > 0, STATS=stats,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
            **_dot_options(q), num_warps=warps,
        )
        ctx.opts = opts
        ctx.has_pad = padding is not None
        ctx.save_for_backward(q, k, v, pad, seed)
        return out, total, s_log_s

    @staticmethod
    def backward(ctx, grad_out, grad_total, grad_s_log_s):
        q, k, v, pad, seed = ctx.saved_tensors
        act, scale, slope, p, stats, causal, offset = ctx.opts
        b, h, t, dh = q.shape
        s = k.shape[2]
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
        stats_grad = stats and (grad_total is not None or grad_s_log_s is not None)
        if stats_grad:  # float32 [B,H,T], contiguous; a missing one is zero
            grad_total, grad_s_log_s = (torch.zeros(b, h, t, dtype=torch.float32, device=q.device) if g is None
                                        else g.float().contiguous() for g in (grad_total, grad_s_log_s))
        else:
            grad_total = grad_s_log_s = q  # dummy pointers
        _, _, _, block, warps, block_d = _launch_config(q, s)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        grid = (triton.cdiv(max(t, s), block), b * h)
        _bwd_kernel[grid](
            q, k, v, grad_out, grad_total, grad_s_log_s, dq, dk, dv, pad, seed,
            *_strides(q), *_strides(k), *_strides(v), *_strides(grad_out),
            *_strides(dq), *_strides(dk), *_strides(dv),
            *_pad_strides(pad if ctx.has_pad else None), h, t, s, dh, offset, scale, slope, p,
            ACT=act, CAUSAL=causal, HAS_PAD=ctx.has_pad, DROPOUT=p > 0, STATS=stats_grad,
            BLOCK=block, BLOCK_D=block_d,
            **_dot_options(q), num_warps=warps,
        )
        return dq, dk, dv, None, None, None


if triton is not None:

    @triton.jit
    def _keep(qi, kj, S, offset, pad_ptr, stride_ps, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr):
        """The 0/1 keep mask (bool) of queries ``qi`` x keys ``kj`` (broadcastable index tensors): key in range,
        causal (key <= query + offset), key not padding."""
        keep = kj < S
        if CAUSAL:
            keep = keep & (kj <= qi + offset)
        if HAS_PAD:
            keep = keep & (tl.load(pad_ptr + kj * stride_ps, mask=kj < S, other=0) != 0)
        return keep

    @triton.jit
    def _act(x, ACT: tl.constexpr, slope):
        """relu / gelu (exact, erf) / leaky_relu(slope) (ReLA Eq. 3 and Table 1 rows 9-10)."""
        if ACT == 0:
            y = tl.maximum(x, 0.0)
        elif ACT == 1:
            y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        else:
            y = tl.where(x > 0, x, x * slope)
        return y

    @triton.jit
    def _act_grad(x, ACT: tl.constexpr, slope):
        """d act / dx, as autograd's kernels: 0 at x = 0 for relu, ``slope`` at x <= 0 for leaky_relu."""
        if ACT == 0:
            g = tl.where(x > 0, 1.0, 0.0)
        elif ACT == 1:
            g = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476)) + x * tl.exp(-0.5 * x * x) * 0.3989422804014327
        else:
            g = tl.where(x > 0, 1.0, slope)
        return g

    @triton.jit
    def _dropout_scale(seed, qi, kj, bh, p):
        """F.dropout's multiplier (0 or 1 / (1 - p)) of every (query, key) pair of head ``bh``: Philox with counters
        (key, query, batch-head, 0), so forward and backward draw the same numbers in any tile layout."""
        zero = (qi * 0 + kj * 0).to(tl.uint32)
        r, _, _, _ = tl.random.philox(seed, (kj + zero).to(tl.uint32), (qi + zero).to(tl.uint32),
                                      zero + bh.to(tl.uint32), zero)
        u = tl.random.uint_to_uniform_float(r)
        return tl.where(u >= p, 1.0 / (1.0 - p), 0.0)

    @triton.jit
    def _dot(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
        """a @ b in float32 (`_dot_options`)."""
        if WIDEN:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        return tl.dot(a, b, input_precision=PRECISION, out_dtype=tl.float32)

    @triton.jit
    def _keys_end(S, start, offset, BLOCK: tl.constexpr, CAUSAL: tl.constexpr):
        """The end of the keys queries ``start .. start + BLOCK`` may see: S, or causal, the last query + offset."""
        hi = S
        if CAUSAL:  # keys after the block's last query (+ offset) are hidden: their blocks are skipped
            hi = tl.minimum(S, start + BLOCK + offset)
        return hi

    @triton.jit
    def _key_tile(q, K, V, Pad, offs_m, start_n, offs_d, S, D, sks, skd, svs, svd, sps, offset, scale,
                  CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                  WIDEN: tl.constexpr):
        """The key tile from ``start_n`` against the query rows ``offs_m`` (q loaded): (key indices, k, v, the scores
        x = q k^T (times ``scale``), keep), the score recomputation the forward pass and the backward's dq pass
        share; a = act(x) * keep (ReLA Eq. 3; ReLUFormer Eq. 5)."""
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_ok = (offs_n[:, None] < S) & (offs_d[None, :] < D)
        k = tl.load(K + offs_n[:, None] * sks + offs_d[None, :] * skd, mask=kv_ok, other=0.0)
        v = tl.load(V + offs_n[:, None] * svs + offs_d[None, :] * svd, mask=kv_ok, other=0.0)
        x = _dot(q, tl.trans(k), PRECISION, WIDEN) * scale
        keep = _keep(offs_m[:, None], offs_n[None, :], S, offset, Pad, sps, CAUSAL, HAS_PAD)
        return offs_n, k, v, x, keep

    @triton.jit
    def _query_rows(Q, DO, GTotal, GSLogS, offs_m, offs_d, T, D, sqt, sqd, sdot, sdod, STATS: tl.constexpr,
                    BLOCK: tl.constexpr):
        """(q, dO, the rows' gradients of sum_j a_ij and of sum_j a_ij log a_ij: zeros without STATS) of the query
        rows ``offs_m``, as both backward passes read them."""
        row_ok = (offs_m[:, None] < T) & (offs_d[None, :] < D)
        q = tl.load(Q + offs_m[:, None] * sqt + offs_d[None, :] * sqd, mask=row_ok, other=0.0)
        do = tl.load(DO + offs_m[:, None] * sdot + offs_d[None, :] * sdod, mask=row_ok, other=0.0)
        g_total = tl.zeros((BLOCK,), dtype=tl.float32)
        g_slogs = tl.zeros((BLOCK,), dtype=tl.float32)
        if STATS:
            g_total = tl.load(GTotal + offs_m, mask=offs_m < T, other=0.0)
            g_slogs = tl.load(GSLogS + offs_m, mask=offs_m < T, other=0.0)
        return q, do, g_total, g_slogs

    @triton.jit
    def _fwd_kernel(Q, K, V, Out, RowSum, SLogS, Pad, Seed,
                    sqb, sqh, sqt, sqd, skb, skh, sks, skd, svb, svh, svs, svd, sob, soh, sot, sod, spb, sps,
                    H, T, S, D, offset, scale, slope, p,
                    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, DROPOUT: tl.constexpr,
                    STATS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    PRECISION: tl.constexpr, WIDEN: tl.constexpr):
        """One query block of one head: o = sum over key blocks of dropout(act(q k^T) * keep) v; with STATS the
        row sums of a and of a log a (Shen et al. 2023, Eq. 7)."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)  # (64-bit base offsets: tensors over 2^31 elements)
        h = (bh % H).to(tl.int64)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :] * sqd,
                    mask=(offs_m[:, None] < T) & (offs_d[None, :] < D), other=0.0)
        K += b * skb + h * skh
        V += b * svb + h * svh
        pad_ptr = Pad + b * spb
        seed = 0
        if DROPOUT:
            seed = tl.load(Seed)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        s_log_s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start_n in range(0, _keys_end(S, start_m, offset, BLOCK_M, CAUSAL), BLOCK_N):
            offs_n, k, v, x, keep = _key_tile(q, K, V, pad_ptr, offs_m, start_n, offs_d, S, D, sks, skd, svs, svd,
                                              sps, offset, scale, CAUSAL, HAS_PAD, BLOCK_N, PRECISION, WIDEN)
            a = tl.where(keep, _act(x, ACT, slope), 0.0)  # ReLA Eq. 3; ReLUFormer Eq. 5
            if STATS:
                row_sum += tl.sum(a, 1)
                s_log_s += tl.sum(a * tl.log(tl.maximum(a, 1e-30)), 1)
            if DROPOUT:
                a = a * _dropout_scale(seed, offs_m[:, None], offs_n[None, :], bh, p)
            acc += _dot(a.to(v.dtype), v, PRECISION, WIDEN)
        tl.store(Out + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :] * sod,
                 acc.to(Out.dtype.element_ty), mask=(offs_m[:, None] < T) & (offs_d[None, :] < D))
        if STATS:
            tl.store(RowSum + bh * T + offs_m, row_sum, mask=offs_m < T)
            tl.store(SLogS + bh * T + offs_m, s_log_s, mask=offs_m < T)

    @triton.jit
    def _grad_scores(x, keep, dov, qi, kj, bh, seed, p, g_total, g_slogs, ACT: tl.constexpr, slope,
                     DROPOUT: tl.constexpr, STATS: tl.constexpr):
        """(the weights as the output used them, d loss / d scores) of one tile: x its scores, dov = dO v^T, and
        the rows' gradients of sum_j a_ij and sum_j a_ij log a_ij (d/da: 1 and log a + 1; relu zeroes a = 0)."""
        a = tl.where(keep, _act(x, ACT, slope), 0.0)
        used = a
        grad_a = dov
        if DROPOUT:
            mult = _dropout_scale(seed, qi, kj, bh, p)
            used = a * mult
            grad_a = dov * mult
        if STATS:
            grad_a += g_total + g_slogs * (tl.log(tl.maximum(a, 1e-30)) + 1.0)
        return used, tl.where(keep, grad_a * _act_grad(x, ACT, slope), 0.0)

    @triton.jit
    def _bwd_kernel(Q, K, V, DO, GTotal, GSLogS, DQ, DK, DV, Pad, Seed,
                    sqb, sqh, sqt, sqd, skb, skh, sks, skd, svb, svh, svs, svd, sdob, sdoh, sdot, sdod,
                    sdqb, sdqh, sdqt, sdqd, sdkb, sdkh, sdks, sdkd, sdvb, sdvh, sdvs, sdvd, spb, sps,
                    H, T, S, D, offset, scale, slope, p,
                    ACT: tl.constexpr, CAUSAL: tl.constexpr, HAS_PAD: tl.constexpr, DROPOUT: tl.constexpr,
                    STATS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
                    WIDEN: tl.constexpr):
        """Program i of head bh: dk, dv of key block i (`_bwd_keys`), then dq of query block i (`_bwd_queries`).
        Scores and weights are recomputed, never stored."""
        start = tl.program_id(0) * BLOCK
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)  # (64-bit base offsets: tensors over 2^31 elements)
        h = (bh % H).to(tl.int64)
        Q += b * sqb + h * sqh
        K += b * skb + h * skh
        V += b * svb + h * svh
        DO += b * sdob + h * sdoh
        GTotal += bh * T
        GSLogS += bh * T
        Pad += b * spb
        seed = 0
        if DROPOUT:
            seed = tl.load(Seed)
        if start < S:
            _bwd_keys(Q, K, V, DO, GTotal, GSLogS, DK + b * sdkb + h * sdkh, DV + b * sdvb + h * sdvh, Pad, seed, bh,
                      sqt, sqd, sks, skd, svs, svd, sdot, sdod, sdks, sdkd, sdvs, sdvd, sps,
                      start, T, S, D, offset, scale, slope, p, ACT, CAUSAL, HAS_PAD, DROPOUT, STATS, BLOCK,
                      BLOCK_D, PRECISION, WIDEN)
        if start < T:
            _bwd_queries(Q, K, V, DO, GTotal, GSLogS, DQ + b * sdqb + h * sdqh, Pad, seed, bh,
                         sqt, sqd, sks, skd, svs, svd, sdot, sdod, sdqt, sdqd, sps,
                         start, T, S, D, offset, scale, slope, p, ACT, CAUSAL, HAS_PAD, DROPOUT, STATS, BLOCK,
                         BLOCK_D, PRECISION, WIDEN)

    @triton.jit
    def _bwd_keys(Q, K, V, DO, GTotal, GSLogS, DK, DV, Pad, seed, bh,
                  sqt, sqd, sks, skd, svs, svd, sdot, sdod, sdks, sdkd, sdvs, sdvd, sps,
                  start, T, S, D, offset, scale, slope, p, ACT: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_PAD: tl.constexpr, DROPOUT: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
        """dk, dv of keys start .. start + BLOCK over every query block that sees them (tiles keys x queries):
        dv_j = sum_i dropout(a)_ij dO_i, dk_j = sum_i dx_ij q_i."""
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = start + tl.arange(0, BLOCK)
        kv_ok = (offs_n[:, None] < S) & (offs_d[None, :] < D)
        k = tl.load(K + offs_n[:, None] * sks + offs_d[None, :] * skd, mask=kv_ok, other=0.0)
        v = tl.load(V + offs_n[:, None] * svs + offs_d[None, :] * svd, mask=kv_ok, other=0.0)
        dk = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
        lo = 0
        if CAUSAL:  # queries before key - offset do not see it: skip their blocks
            lo = (tl.maximum(start - offset, 0) // BLOCK) * BLOCK
        for start_m in range(lo, T, BLOCK):
            offs_m = start_m + tl.arange(0, BLOCK)
            q, do, g_total, g_slogs = _query_rows(Q, DO, GTotal, GSLogS, offs_m, offs_d, T, D, sqt, sqd, sdot, sdod,
                                                  STATS, BLOCK)
            x_t = _dot(k, tl.trans(q), PRECISION, WIDEN) * scale  # the scores, keys x queries
            keep_t = _keep(offs_m[None, :], offs_n[:, None], S, offset, Pad, sps, CAUSAL, HAS_PAD)
            dov_t = _dot(v, tl.trans(do), PRECISION, WIDEN)
            used_t, dx_t = _grad_scores(x_t, keep_t, dov_t, offs_m[None, :], offs_n[:, None], bh, seed, p,
                                        g_total[None, :], g_slogs[None, :], ACT, slope, DROPOUT, STATS)
            dv += _dot(used_t.to(do.dtype), do, PRECISION, WIDEN)
            dk += _dot(dx_t.to(q.dtype), q, PRECISION, WIDEN)
        tl.store(DK + offs_n[:, None] * sdks + offs_d[None, :] * sdkd, (dk * scale).to(DK.dtype.element_ty),
                 mask=kv_ok)
        tl.store(DV + offs_n[:, None] * sdvs + offs_d[None, :] * sdvd, dv.to(DV.dtype.element_ty), mask=kv_ok)

    @triton.jit
    def _bwd_queries(Q, K, V, DO, GTotal, GSLogS, DQ, Pad, seed, bh,
                     sqt, sqd, sks, skd, svs, svd, sdot, sdod, sdqt, sdqd, sps,
                     start, T, S, D, offset, scale, slope, p, ACT: tl.constexpr, CAUSAL: tl.constexpr,
                     HAS_PAD: tl.constexpr, DROPOUT: tl.constexpr, STATS: tl.constexpr, BLOCK: tl.constexpr,
                     BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
        """dq of queries start .. start + BLOCK over every key block they see: dq_i = sum_j dx_ij k_j."""
        offs_d = tl.arange(0, BLOCK_D)
        offs_m = start + tl.arange(0, BLOCK)
        row_ok = (offs_m[:, None] < T) & (offs_d[None, :] < D)
        q, do, g_total, g_slogs = _query_rows(Q, DO, GTotal, GSLogS, offs_m, offs_d, T, D, sqt, sqd, sdot, sdod,
                                              STATS, BLOCK)
        dq = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
        for start_n in range(0, _keys_end(S, start, offset, BLOCK, CAUSAL), BLOCK):
            offs_n, k, v, x, keep = _key_tile(q, K, V, Pad, offs_m, start_n, offs_d, S, D, sks, skd, svs, svd, sps,
                                              offset, scale, CAUSAL, HAS_PAD, BLOCK, PRECISION, WIDEN)
            dov = _dot(do, tl.trans(v), PRECISION, WIDEN)
            _, dx = _grad_scores(x, keep, dov, offs_m[:, None], offs_n[None, :], bh, seed, p,
                                 g_total[:, None], g_slogs[:, None], ACT, slope, DROPOUT, STATS)
            dq += _dot(dx.to(k.dtype), k, PRECISION, WIDEN)
        tl.store(DQ + offs_m[:, None] * sdqt + offs_d[None, :] * sdqd, (dq * scale).to(DQ.dtype.element_ty),
                 mask=row_ok)
