"""Calibrated cross-attention (Lu et al. 2021) as one fused Triton kernel: the output, its gradient and the mask
statistics without a ``[B, H, T, S]`` tensor (the flash-attention loop, Dao et al. 2022, with another numerator).

Per query row i and real source token j (`attention_calibration` has the paper's notation):

    a_ij = softmax_j(q_i k_j / sqrt(dh))                         Eq. 1    (online softmax over key blocks)
    m_ij = sigmoid(q'_i k'_j / sqrt(dh)),  0 on padding          Eq. 4
    calibrated pass (mode "calibrated"): w_ij = a_ij (G_i + H_i exp(1 - m_ij))      Eq. 7-10 as one factor:
        fixed (released): G = 1, H = lambda;  anneal (Eq. 9): G = r, H = 1 - r;  gate (Eq. 10): G = g, H = 1 - g
    perturbed pass (mode "perturbed"): w_ij = m_ij a_ij + (1 - m_ij) mu0_j,  mu0 = 1/J on real tokens   Eq. 3
    o_i = sum_j dropout(w)_ij v_j                                Eq. 1's weighted sum, dropout on the final weights

In the calibrated pass the same loop also gives, per row, sum_j (1 - m_ij)^2 and sum_j m_ij over the real tokens:
the mask penalty of Eq. 5-6 and the logged mean mask (`CalibratedAttention._statistics`).

Gradients (backward recomputes a, m and the dropout mask block by block). With A_ij = dw_ij / da_ij (G + H e^(1-m)
or m), the softmax's row term is Delta_i = sum_j a_ij A_ij dw_ij = dO_i . O1_i, O1 the a-part of the output (= O in
the calibrated pass); ds = a (A dw - Delta), dm = -a H e^(1-m) dw (calibrated) or (a - mu0) dw (perturbed),
dt = dm m (1 - m) on the mask logits. The mask's inputs come twice (`CalibratedAttentionFunction`): the output's
gradient goes to (q', k'), the penalty's to (q'_phi, k'_phi), so the single-loss construction's detach rules hold.

Dropout (Lu et al. train with the Transformer's attention dropout on the final weights): keep_ij = (rand(seed,
(bh T + i) S + j) >= p), Triton's counter-based generator, regenerated in the backward pass; not torch's stream.
Float32 accumulation; q, k, v (and q', k') in their own dtype into tl.dot (bf16 under autocast, as flash
attention). Ships flat with the model: triton is optional (`fused.triton` is None without it).
"""

from __future__ import annotations

import torch

from .fused import interpreting, tl, triton

MODES = ("calibrated", "perturbed")


def _block_size(n: int, block: int | None) -> int:
    return block or (32 if interpreting() else 64)


def _dot_dtype(q: torch.Tensor):
    """The dtype the tiles enter tl.dot in: q's (every input is cast to it); float32 under Triton's interpreter,
    whose arithmetic on bf16 / fp16 tiles is wrong (numpy has no bf16: it computes on the raw bits)."""
    if interpreting():
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(q.dtype, tl.float32)


if triton is not None:

    @triton.jit
    def _keep(seed, row, cols, n_cols, p, DROPOUT: tl.constexpr):
        """Dropout's keep mask / (1 - p) of rows ``row`` x keys ``cols`` (1.0 without dropout)."""
        if DROPOUT:
            offsets = (row[:, None] * n_cols + cols[None, :]).to(tl.int32)
            return tl.where(tl.rand(seed, offsets) >= p, 1.0 / (1.0 - p), 0.0)
        return tl.full((1, 1), 1.0, tl.float32)

    @triton.jit
    def _query_tile(Q, QP, GA, GC, b, h, bh, rows, dims, T, D, sqb, sqh, sqt, spb, sph, spt, DT: tl.constexpr):
        """(q, q', the gains G and H of Eq. 7-10, the row mask, the rows x dims mask) of query rows ``rows`` of head
        (b, h), as every kernel reads them."""
        rmask = rows < T
        qd = rmask[:, None] & (dims < D)[None, :]
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqt + dims[None, :], mask=qd, other=0.0).to(DT)
        qp = tl.load(QP + b * spb + h * sph + rows[:, None] * spt + dims[None, :], mask=qd, other=0.0).to(DT)
        g_a = tl.load(GA + bh * T + rows, mask=rmask, other=0.0)
        g_c = tl.load(GC + bh * T + rows, mask=rmask, other=0.0)
        return q, qp, g_a, g_c, rmask, qd

    @triton.jit
    def _program(H, BLOCK: tl.constexpr, BD: tl.constexpr):
        """(this program's block of query rows or keys, the head dims, bh, b, h): block ``tl.program_id(0)`` of
        batch x head ``tl.program_id(1)`` (64-bit: tensors over 2^31 elements)."""
        pid, bh = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
        return pid * BLOCK + tl.arange(0, BLOCK), tl.arange(0, BD), bh, bh // H, bh % H

    @triton.jit
    def _key_tile(K, V, KP, REAL, NREAL, b, h, cols, dims, S, D, skb, skh, sks, svb, svh, svs, skpb, skph, skps,
                  DT: tl.constexpr):
        """(k, v, k', real (1 on real source tokens), visible, mu0 = 1/J on real tokens (Eq. 3), the keys x dims
        mask) of key columns ``cols`` of head (b, h), as every kernel reads them: the source side of the scores
        (Eq. 1) and of the mask (Eq. 4) that the forward and both backward passes recompute."""
        cmask = cols < S
        kd = cmask[:, None] & (dims < D)[None, :]
        k = tl.load(K + b * skb + h * skh + cols[:, None] * sks + dims[None, :], mask=kd, other=0.0).to(DT)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svs + dims[None, :], mask=kd, other=0.0).to(DT)
        kp = tl.load(KP + b * skpb + h * skph + cols[:, None] * skps + dims[None, :], mask=kd, other=0.0).to(DT)
        real = tl.load(REAL + b * S + cols, mask=cmask, other=0.0)
        n_real = tl.load(NREAL + b)
        # a source with no real token: every key visible (no NaN; the row is discarded)
        visible = cmask & ((real + (n_real == 0).to(tl.float32)) > 0)
        return k, v, kp, real, visible, real / tl.maximum(n_real, 1.0), kd

    @triton.jit
    def _grad_rows(DO, LSE, DELTA, DPSQ, bh, rows, dims, T, D, rmask, qd, STATS: tl.constexpr, BM: tl.constexpr,
                   DT: tl.constexpr):
        """(dO, the softmax's log-sum-exp, Delta, the penalty's row gradient: zeros without STATS) of query rows
        ``rows``, as both backward kernels read them."""
        do = tl.load(DO + bh * T * D + rows[:, None] * D + dims[None, :], mask=qd, other=0.0).to(DT)
        lse = tl.load(LSE + bh * T + rows, mask=rmask, other=0.0)
        delta = tl.load(DELTA + bh * T + rows, mask=rmask, other=0.0)
        dpsq = tl.zeros((BM,), tl.float32)
        if STATS:
            dpsq = tl.load(DPSQ + bh * T + rows, mask=rmask, other=0.0)
        return do, lse, delta, dpsq

    @triton.jit
    def _mask(qp, kp, real, scale):
        """(sigmoid(q' k'^T / sqrt(dh)), m = the same, 0 on padding) of one block (Eq. 4)."""
        sig = 1.0 / (1.0 + tl.exp(-tl.dot(qp, tl.trans(kp)) * scale))
        return sig, sig * real[None, :]

    @triton.jit
    def _weights(q, k, qp, kp, lse, real, visible, u, gain_a, gain_c, scale, PERTURBED: tl.constexpr):
        """(a, m, sigmoid(t), A, B, e^(1-m)) of one block: w = a A + B (Eq. 1, 3, 4, 7-10)."""
        s = tl.dot(q, tl.trans(k)) * scale
        a = tl.where(visible[None, :], tl.exp(s - lse[:, None]), 0.0)
        sig, m = _mask(qp, kp, real, scale)
        e = tl.exp(1.0 - m)
        if PERTURBED:
            return a, m, sig, m, (1.0 - m) * u[None, :], e
        return a, m, sig, gain_a[:, None] + gain_c[:, None] * e, tl.zeros_like(a), e

    @triton.jit
    def _fwd_kernel(Q, K, V, QP, KP, REAL, NREAL, GA, GC, O, O1, LSE, PSQ, MSUM,
                    sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, spb, sph, spt, skpb, skph, skps,
                    H, T, S, D, scale, seed, p,
                    PERTURBED: tl.constexpr, STATS: tl.constexpr, DROPOUT: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, DT: tl.constexpr):
        rows, dims, bh, b, h = _program(H, BM, BD)
        q, qp, g_a, g_c, rmask, qd = _query_tile(Q, QP, GA, GC, b, h, bh, rows, dims, T, D, sqb, sqh, sqt, spb, sph,
                                                 spt, DT)
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, BD), tl.float32)  # the a-part (online softmax, rescaled)
        acc_u = tl.zeros((BM, BD), tl.float32)  # the uniform part of Eq. 3 (perturbed pass)
        psq = tl.zeros((BM,), tl.float32)
        msum = tl.zeros((BM,), tl.float32)
        for start in range(0, S, BN):
            cols = start + tl.arange(0, BN).to(tl.int64)
            k, v, kp, real, visible, u, _ = _key_tile(K, V, KP, REAL, NREAL, b, h, cols, dims, S, D, skb, skh, sks,
                                                      svb, svh, svs, skpb, skph, skps, DT)
            s = tl.where(visible[None, :], tl.dot(q, tl.trans(k)) * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            rescale = tl.exp(m_i - m_new)
            pexp = tl.exp(s - m_new[:, None])
            l_i = l_i * rescale + tl.sum(pexp, 1)
            _, m = _mask(qp, kp, real, scale)  # Eq. 4, 0 on padding
            keep = _keep(seed, bh * T + rows, cols, S, p, DROPOUT)
            if PERTURBED:  # Eq. 3: m a + (1 - m) mu0
                num = pexp * m * keep
                acc_u += tl.dot(((1.0 - m) * u[None, :] * keep).to(v.dtype), v)
            else:  # Eq. 7-10: a (G + H exp(1 - m))
                num = pexp * (g_a[:, None] + g_c[:, None] * tl.exp(1.0 - m)) * keep
            if STATS:  # Eq. 5-6's penalty and the mean mask, over the real tokens
                psq += tl.sum((1.0 - m) * (1.0 - m) * real[None, :], 1)
                msum += tl.sum(m, 1)
            acc = acc * rescale[:, None] + tl.dot(num.to(v.dtype), v)
            m_i = m_new
        acc = acc / l_i[:, None]
        out = O + bh * T * D + rows[:, None] * D + dims[None, :]
        tl.store(out, acc + acc_u, mask=qd)
        if PERTURBED:
            tl.store(O1 + bh * T * D + rows[:, None] * D + dims[None, :], acc, mask=qd)
        tl.store(LSE + bh * T + rows, m_i + tl.log(l_i), mask=rmask)
        if STATS:
            tl.store(PSQ + bh * T + rows, psq, mask=rmask)
            tl.store(MSUM + bh * T + rows, msum, mask=rmask)

    @triton.jit
    def _grad_block(a, m, sig, e, A, dw, delta, real, u, g_c, dpsq, PERTURBED: tl.constexpr, STATS: tl.constexpr):
        """(ds, dt, dt_phi) of one block: the gradients on the scores, the mask logits through the output, and the
        mask logits through the penalty (zeros without it)."""
        ds = a * (A * dw - delta[:, None])  # softmax backward (Eq. 1)
        if PERTURBED:
            dm = (a - u[None, :]) * dw  # Eq. 3
        else:
            dm = -a * g_c[:, None] * e * dw  # Eq. 7-10
        slope = sig * (1.0 - sig) * real[None, :]  # dm/dt (Eq. 4; m = 0 on padding)
        dt_phi = tl.zeros_like(ds)
        if STATS:
            dt_phi = -2.0 * (1.0 - m) * dpsq[:, None] * slope  # d/dt of sum_j (1 - m)^2 (Eq. 6)
        return ds, dm * slope, dt_phi

    @triton.jit
    def _bwd_kernel(Q, K, V, QP, KP, REAL, NREAL, GA, GC, DO, LSE, DELTA, DPSQ, DQ, DQP, DQPP, DGA, DGC, DK, DV, DKP,
                    DKPP, sqb, sqh, sqt, skb, skh, sks, svb, svh, svs, spb, sph, spt, skpb, skph, skps,
                    H, T, S, D, scale, seed, p, KEYS: tl.constexpr,
                    PERTURBED: tl.constexpr, STATS: tl.constexpr, DROPOUT: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, DT: tl.constexpr):
        """KEYS: dk, dv, dk' (and dk'_phi) of one key block over every query block; else dq, dq' (and dq'_phi) and
        the gains' gradients of one query block over every key block. a, m and the dropout mask are recomputed
        block by block (`_weights`, `_keep`); ds, dt, dt_phi as `_grad_block` gives them."""
        if KEYS:
            cols, dims, bh, b, h = _program(H, BN, BD)
            k, v, kp, real, visible, u, kd = _key_tile(K, V, KP, REAL, NREAL, b, h, cols, dims, S, D, skb, skh, sks,
                                                       svb, svh, svs, skpb, skph, skps, DT)
            dk, dv = tl.zeros((BN, BD), tl.float32), tl.zeros((BN, BD), tl.float32)
            dkp, dkpp = tl.zeros((BN, BD), tl.float32), tl.zeros((BN, BD), tl.float32)
            for start in range(0, T, BM):
                rows = start + tl.arange(0, BM).to(tl.int64)
                q, qp, g_a, g_c, rmask, qd = _query_tile(Q, QP, GA, GC, b, h, bh, rows, dims, T, D, sqb, sqh, sqt,
                                                         spb, sph, spt, DT)
                do, lse, delta, dpsq = _grad_rows(DO, LSE, DELTA, DPSQ, bh, rows, dims, T, D, rmask, qd, STATS, BM, DT)
                a, m, sig, A, Bu, e = _weights(q, k, qp, kp, lse, real, visible, u, g_a, g_c, scale, PERTURBED)
                a = tl.where(rmask[:, None], a, 0.0)
                keep = _keep(seed, bh * T + rows, cols, S, p, DROPOUT)
                dv += tl.dot(tl.trans((a * A + Bu) * keep).to(do.dtype), do)
                dw = tl.dot(do, tl.trans(v)) * keep
                ds, dt, dt_phi = _grad_block(a, m, sig, e, A, dw, delta, real, u, g_c, dpsq, PERTURBED, STATS)
                dk += tl.dot(tl.trans(ds).to(q.dtype), q)
                dkp += tl.dot(tl.trans(dt).to(qp.dtype), qp)
                if STATS:
                    dkpp += tl.dot(tl.trans(dt_phi).to(qp.dtype), qp)
            at = bh * S * D + cols[:, None] * D + dims[None, :]
            tl.store(DK + at, dk * scale, mask=kd)
            tl.store(DV + at, dv, mask=kd)
            tl.store(DKP + at, dkp * scale, mask=kd)
            if STATS:
                tl.store(DKPP + at, dkpp * scale, mask=kd)
        else:
            rows, dims, bh, b, h = _program(H, BM, BD)
            q, qp, g_a, g_c, rmask, qd = _query_tile(Q, QP, GA, GC, b, h, bh, rows, dims, T, D, sqb, sqh, sqt, spb,
                                                     sph, spt, DT)
            do, lse, delta, dpsq = _grad_rows(DO, LSE, DELTA, DPSQ, bh, rows, dims, T, D, rmask, qd, STATS, BM, DT)
            dq, dqp = tl.zeros((BM, BD), tl.float32), tl.zeros((BM, BD), tl.float32)
            dqpp = tl.zeros((BM, BD), tl.float32)
            dga, dgc = tl.zeros((BM,), tl.float32), tl.zeros((BM,), tl.float32)
            for start in range(0, S, BN):
                cols = start + tl.arange(0, BN).to(tl.int64)
                k, v, kp, real, visible, u, _ = _key_tile(K, V, KP, REAL, NREAL, b, h, cols, dims, S, D, skb, skh,
                                                          sks, svb, svh, svs, skpb, skph, skps, DT)
                a, m, sig, A, _, e = _weights(q, k, qp, kp, lse, real, visible, u, g_a, g_c, scale, PERTURBED)
                dw = tl.dot(do, tl.trans(v)) * _keep(seed, bh * T + rows, cols, S, p, DROPOUT)
                ds, dt, dt_phi = _grad_block(a, m, sig, e, A, dw, delta, real, u, g_c, dpsq, PERTURBED, STATS)
                if not PERTURBED:  # the gains' gradients (the gate's, Eq. 10)
                    dga += tl.sum(a * dw, 1)
                    dgc += tl.sum(a * e * dw, 1)
                dq += tl.dot(ds.to(k.dtype), k)
                dqp += tl.dot(dt.to(kp.dtype), kp)
                if STATS:
                    dqpp += tl.dot(dt_phi.to(kp.dtype), kp)
            at = bh * T * D + rows[:, None] * D + dims[None, :]
            tl.store(DQ + at, dq * scale, mask=qd)
            tl.store(DQP + at, dqp * scale, mask=qd)
            if STATS:
                tl.store(DQPP + at, dqpp * scale, mask=qd)
            if not PERTURBED:
                tl.store(DGA + bh * T + rows, dga, mask=rmask)
                tl.store(DGC + bh * T + rows, dgc, mask=rmask)


def _strides(*tensors) -> list[int]:
    return [st for t in tensors for st in t.stride()[:3]]


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class CalibratedAttentionFunction(torch.autograd.Function):
    """(o [B,H,T,dh], penalty sum_j (1 - m)^2 [B,H,T], mask sum_j m [B,H,T]) of the calibrated or perturbed pass (see
    the module docstring). ``q, k, v`` [B,H,T|S,dh]; ``qp, kp`` q', k' (Eq. 4) as the output's gradient reaches them;
    ``qp_phi, kp_phi`` (same values, or None: no statistics) as the penalty's gradient reaches them; ``gain_a,
    gain_c`` G, H [B,H,T] float32; ``real`` [B,S] float32 (1 on real source tokens)."""

    @staticmethod
    def forward(ctx, q, k, v, qp, kp, qp_phi, kp_phi, gain_a, gain_c, real, mode, dropout, seed, block):
        q, k, v, qp, kp = (_last_dim_contiguous(t) for t in (q, k, v, qp, kp))
        bsz, heads, tgt, dh = q.shape
        src = k.shape[2]
        perturbed, stats = mode == "perturbed", qp_phi is not None
        real = real.float().contiguous()
        n_real = real.sum(-1).contiguous()
        gain_a, gain_c = gain_a.float().contiguous(), gain_c.float().contiguous()
        o = torch.empty(bsz, heads, tgt, dh, device=q.device, dtype=v.dtype)
        o1 = torch.empty(bsz, heads, tgt, dh, device=q.device, dtype=torch.float32) if perturbed else o
        lse = torch.empty(bsz, heads, tgt, device=q.device, dtype=torch.float32)
        psq = torch.zeros(bsz, heads, tgt, device=q.device, dtype=torch.float32)
        msum = torch.zeros_like(psq)
        bm = bn = _block_size(max(tgt, src), block)
        bd = max(16, triton.next_power_of_2(dh))
        _fwd_kernel[(triton.cdiv(tgt, bm), bsz * heads)](
            q, k, v, qp, kp, real, n_real, gain_a, gain_c, o, o1, lse, psq, msum, *_strides(q, k, v, qp, kp),
            heads, tgt, src, dh, dh**-0.5, seed, dropout,
            PERTURBED=perturbed, STATS=stats, DROPOUT=dropout > 0, BM=bm, BN=bn, BD=bd, DT=_dot_dtype(q))
        ctx.save_for_backward(q, k, v, qp, kp, real, n_real, gain_a, gain_c, o1, lse)
        ctx.setup = (perturbed, stats, dropout, seed, bm, bd)
        ctx.mark_non_differentiable(msum)
        return o, psq, msum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do, dpsq, _dmsum):
        q, k, v, qp, kp, real, n_real, gain_a, gain_c, o1, lse = ctx.saved_tensors
        perturbed, stats, dropout, seed, block, bd = ctx.setup
        bsz, heads, tgt, dh = q.shape
        src = k.shape[2]
        do = do.contiguous()
        delta = (do.float() * o1.float()).sum(-1)  # Delta_i = dO_i . O1_i (module docstring)
        stats = stats and dpsq is not None
        dpsq = dpsq.float().contiguous() if stats else lse
        f32 = dict(device=q.device, dtype=torch.float32)
        dq, dqp, dqpp = (torch.empty(bsz, heads, tgt, dh, **f32) for _ in range(3))
        dk, dv, dkp, dkpp = (torch.empty(bsz, heads, src, dh, **f32) for _ in range(4))
        dga, dgc = torch.zeros(bsz, heads, tgt, **f32), torch.zeros(bsz, heads, tgt, **f32)
        common = (*_strides(q, k, v, qp, kp), heads, tgt, src, dh, dh**-0.5, seed, dropout)
        flags = dict(PERTURBED=perturbed, STATS=stats, DROPOUT=dropout > 0, BM=block, BN=block, BD=bd, DT=_dot_dtype(q))
        inputs = (q, k, v, qp, kp, real, n_real, gain_a, gain_c, do, lse, delta, dpsq)
        outputs = (dq, dqp, dqpp, dga, dgc, dk, dv, dkp, dkpp)
        for keys, n in ((False, tgt), (True, src)):  # dq (query blocks), then dk, dv (key blocks): one kernel each
            _bwd_kernel[(triton.cdiv(n, block), bsz * heads)](*inputs, *outputs, *common, KEYS=keys, **flags)
        phi = (dqpp.to(qp.dtype), dkpp.to(kp.dtype)) if stats else (None, None)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dqp.to(qp.dtype), dkp.to(kp.dtype), *phi,
                None if perturbed else dga, None if perturbed else dgc, None, None, None, None, None)


def calibrated_attention(q, k, v, qp, kp, real, gain_a=None, gain_c=None, mode: str = "calibrated",
                         dropout: float = 0.0, phi=None, seed: int | None = None, block: int | None = None):
    """(o, penalty [B,H,T] or None, mask sum [B,H,T] or None): `CalibratedAttentionFunction` with G, H broadcast to
    [B,H,T] (tensors or floats; unused by the perturbed pass), ``phi`` = (q'_phi, k'_phi) for the statistics, and
    a fresh dropout seed from torch's generator unless given."""
    if mode not in MODES:
        raise ValueError(f"calibrated_attention: mode {mode!r} is not one of {MODES}")
    shape = q.shape[:3]
    gains = [torch.as_tensor(1.0 if g is None else g, device=q.device, dtype=torch.float32).expand(shape)
             for g in (gain_a, gain_c)]
    if seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if dropout > 0 else 0
    qp_phi, kp_phi = phi if phi is not None else (None, None)
    o, psq, msum = CalibratedAttentionFunction.apply(q, k, v, qp, kp, qp_phi, kp_phi, *gains, real, mode,
                                                     float(dropout), seed, block)
    return o, (psq if phi is not None else None), (msum if phi is not None else None)


def dropout_keep(seed: int, shape: tuple[int, int, int, int], p: float, device="cpu") -> torch.Tensor:
    """The kernels' dropout keep mask [B,H,T,S] (float32: 1/(1-p) or 0) for ``seed``: for tests and analysis."""
    bsz, heads, tgt, src = shape
    out = torch.empty(bsz * heads * tgt, src, device=device, dtype=torch.float32)
    _keep_kernel[(bsz * heads * tgt,)](out, src, seed, p, BN=triton.next_power_of_2(src))
    return out.view(shape)


if triton is not None:

    @triton.jit
    def _keep_kernel(OUT, S, seed, p, BN: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BN)
        keep = _keep(seed, row + tl.zeros((1,), tl.int32), cols, S, p, True)
        tl.store(OUT + row * S + cols[None, :], keep, mask=(cols < S)[None, :])
