"""ReLUFormer: ReLU attention with length-dependent variance reduction and its regulariser (Shen, Guo, Tan, Tang,
Wang & Bian 2023, "A Study on ReLU and Softmax in Transformer"). No official code exists; where the paper is
ambiguous the choice is stated at the equation it concerns.

Per head, for query i with n_i visible keys (the real mask: source length for encoder self-attention and
cross-attention, i+1 for causal self-attention, the cache length + 1 during incremental decoding):

    s_ij  = relu(q_i k_j^T / sqrt(dh)) * keep_ij / (gamma * sqrt(n_i / 2))     Eq. 5-6 (variance reduction factor)
    h_i   = sum_j dropout(s)_ij v_j                                             Eq. 6   (no normalisation of h)
    L_reg = |log sum_j s_ij| + max(H(p_i) - C_i, 0),  p_i = s_i / sum_j s_ij    Eq. 7   (|.|: the text, not the
            C_i = 0.7 log n_i  (Appendix A; 0 for n_i = 1)                                printed formula)

L_reg is averaged over valid queries and heads of each layer, then over layers, multiplied by
``reluformer_reg_weight`` (the paper gives no weight; default 0.05, because at 1 the attention collapses in
hf-attn's recipe-sensitivity runs: the README's report, docs/papers/reluformer.md) and returned as ``aux_loss``
(hence reaching the optimiser also with label smoothing; hf_attn.training adds it). The logs report
``reg_loss`` (unweighted L_reg), its two terms, the mean row sum of s and ``attn_entropy`` (mean H(p), nats; the
paper's Table 3/5 statistic). Row sums are clamped before the log (an all-zero row has sum 0: its L_reg is
|log eps| with zero gradient, never NaN); the statistics run in float32 even under fp16/bf16 autocast.

Long inputs (the paper's 512-2048-token documents): when queries or keys outnumber ``reluformer_query_chunk``,
the attention runs block-wise over queries and keys (`attention_blockwise`): h and the two row sums L_reg needs
(sum_j s_ij and sum_j s_ij log s_ij) are sums over keys, accumulated block by block, and the backward pass
recomputes each block, so memory grows linearly with the length. Same values and gradients as the full computation.
Shorter inputs run the same kernel as one block whenever the statistics are needed (its backward is written out).
On a GPU (`fused.dispatch`), h and both row sums come at any length from one fused Triton kernel (`triton_relu`).

Table 5 ablations are config switches: ``reluformer_scale=False`` (no variance reduction factor; the paper
reports divergence) and ``reluformer_reg_weight=0`` (no regulariser).

The variant is named ``reluformer`` (``relu`` before; configs saved with that name still load as
``reluformer``); do not confuse it with the ReLA family's *preset* ``relu`` (ReLA with no normalisation,
rela_norm="none", variant ``rela``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .attention_base import VariantAttention
from .attention_blockwise import blockwise_relu_attention, use_blocks
from .cache import CACHE_KWARG
from .citations import CITATIONS
from .fused import TRITON, dispatch
from .hyperparameters import Hyperparameter, Preset, all_sites
from .kernels import float32_autocast_off
from .triton_relu import triton_relu_attention, triton_supports

RELUFORMER_PAPER = CITATIONS["reluformer"]
VARIANT = "reluformer"


def visible_keys(keep) -> torch.Tensor:
    """n per query: the number of keys each query may attend to, ``[B|1, 1, T, 1]`` (int64)."""
    return keep.visible_keys()


def reluformer_attention(q, k, v, keep, *, scaling, gamma=1.0, scale=True, dropout=0.0, eps=1e-6,
                         entropy_bound=0.7, need_weights=False, chunk=0, stats=True, stats_grad=True, fused=False):
    """ReLUFormer attention.

    q ``[B,H,T,dh]`` (unscaled), k/v ``[B,H,S,dh]``, keep a `KeepMask`; block-wise over ``chunk`` queries and keys
    for long inputs (`use_blocks`). Returns (context ``[B,H,T,dh]``, weights s ``[B,H,T,S]`` or None, per-row
    statistics): ``{"norm": |log sum s|, "margin": max(H(p) - C, 0), "entropy": H(p), "row_sum": sum s,
    "rows": n > 0}``, float32 ``[B,H,T]`` (bool for rows); a row without any visible key has rows False and zero
    statistics. ``stats=False``: no statistics (None), for passes that cannot use L_reg (incremental decoding);
    ``stats_grad=False``: statistics without a graph (for the logs alone: L_reg not in the loss). ``fused``: run the
    fused Triton kernel (`triton_relu`) where it supports the call (the caller asks `fused.dispatch`).
    """
    n = visible_keys(keep)
    nf = n.clamp(min=1).float()
    # relu(c x) = c relu(x) for c > 0: the per-query factor scales q (the block-wise kernel applies it to each
    # block's query rows as it gathers them: no [B,H,T,dh] product). Eq. 6: the variance reduction factor
    # gamma * sqrt(n/2), as scaling / (gamma sqrt(n/2))
    factor = nf.rsqrt().mul_(scaling * math.sqrt(2.0) / gamma).to(q.dtype) if scale else scaling
    weights = None
    blocks = use_blocks(q.shape[2], k.shape[2], chunk, need_weights)
    if fused and not need_weights and triton_supports(q, k, keep):  # Eq. 5-7 in one fused kernel, any length
        ctx, raw_total, s_log_s = triton_relu_attention(q * factor, k, v, keep, dropout=dropout, stats=stats)
    elif blocks or stats and not need_weights:
        # the kernel of `attention_blockwise` with its gradient written out: block-wise for long inputs, else one
        # block (the statistics' half dozen [B,H,T,S] passes and their autograd nodes fused)
        chunk = chunk if blocks else max(q.shape[2], k.shape[2])
        ctx, raw_total, s_log_s = blockwise_relu_attention(q, k, v, keep, dropout=dropout, chunk=chunk, stats=stats,
                                                           scale=factor)
    else:
        scores = torch.matmul(q * factor, k.transpose(-1, -2))
        with float32_autocast_off(scores):
            # Eq. 5-6: relu (in place on the fresh product), multiplicative 0/1 mask, no -inf anywhere
            s = keep.zero_hidden(scores.relu_().float())
            if stats:
                raw_total = s.sum(-1)
                s_log_s = (s * s.clamp(min=1e-30).log()).sum(-1)
        dropped = F.dropout(s, p=dropout, training=True) if dropout > 0 else s
        ctx = torch.matmul(dropped if dropped.dtype == v.dtype else dropped.to(v.dtype), v)
        weights = s.to(q.dtype) if need_weights else None
    if not stats:
        return ctx, weights, None
    if not stats_grad:
        raw_total, s_log_s = raw_total.detach(), s_log_s.detach()
    return ctx, weights, row_statistics(raw_total, s_log_s, nf.squeeze(-1), n.squeeze(-1) > 0, eps, entropy_bound)


def row_statistics(raw_total, s_log_s, nf, rows, eps, entropy_bound) -> dict:
    """Eq. 7's terms per row from its two sums over keys (``[B,H,T]``, float32); ``nf``, ``rows`` ``[B|1,1,T]``.
    "norm" and "margin" carry L_reg's gradient (`RegTerms`); "entropy" and "row_sum" are for the logs. ``rows``
    (bool) multiplies float32 terms as it is: type promotion, no float copy."""
    with float32_autocast_off(raw_total):
        norm, margin, entropy = RegTerms.apply(raw_total, s_log_s, entropy_bound * nf.log(), rows, eps)
    return {"norm": norm, "margin": margin, "entropy": entropy, "row_sum": raw_total.detach() * rows,
            "rows": rows.expand_as(raw_total)}


def head_sums(stats: dict) -> dict:
    """`row_statistics` summed over heads (``[B,T]``), as a layer leaves them for `model_losses`: the ``[B,H,T]``
    terms are not kept until the loss is formed; ``rows`` (the same for every head) ``[B,T]``, and ``heads`` H."""
    sums = {key: stats[key].sum(1) for key in ("norm", "margin", "entropy", "row_sum")}
    return {**sums, "rows": stats["rows"][:, 0], "heads": stats["rows"].shape[1]}


class RegTerms(torch.autograd.Function):
    """(|log S|, max(H(p) - C, 0), H(p)) per row, times the bool ``rows`` (0/1), from S = sum_j s_ij (clamped to ``eps``)
    and sum_j s_ij log s_ij (Eq. 7): H(p) = max(log S - sum_j s_ij log s_ij / S, 0). Backward keeps the two sums
    alone (not the half dozen intermediates autograd would keep per attention module until the loss is formed) and
    gives plain autograd's gradient, subgradients included (clamp: 1 at the bound; relu and |.|: 0 at 0)."""

    @staticmethod
    def forward(ctx, raw_total, s_log_s, bound, rows, eps):
        total = raw_total.clamp(min=eps)
        log_total = total.log()
        entropy = (log_total - s_log_s / total).clamp(min=0.0)
        ctx.eps = eps
        ctx.save_for_backward(raw_total, s_log_s, bound, rows)
        ctx.mark_non_differentiable(entropy)
        return log_total.abs() * rows, F.relu(entropy - bound) * rows, entropy * rows

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_norm, grad_margin, _):
        raw_total, s_log_s, bound, rows = ctx.saved_tensors
        total = raw_total.clamp(min=ctx.eps)
        log_total = total.log()
        entropy_raw = log_total - s_log_s / total
        grad_total = torch.zeros_like(total) if grad_norm is None else grad_norm * rows * log_total.sign()
        grad_s_log_s = None
        if grad_margin is not None:  # through relu(clamp(entropy_raw, 0) - C)
            live = (entropy_raw >= 0) & (entropy_raw.clamp(min=0.0) - bound > 0)
            grad_entropy = grad_margin * rows * live
            grad_total = grad_total + grad_entropy * (1 + s_log_s / total)
            grad_s_log_s = -grad_entropy / total
        grad_raw = grad_total / total * (raw_total >= ctx.eps)
        return grad_raw, grad_s_log_s, None, None, None


class ReluFormerAttention(VariantAttention):
    """ReLU attention scaled by 1/(gamma sqrt(n/2)) per query, trained with the entropy/normalisation regulariser."""

    variant = VARIANT
    description = (
        "ReLUFormer attention (Shen et al. 2023): relu(q k^T/sqrt(dh)) / (gamma sqrt(n/2)) with n the visible keys "
        "of each query, no output norm, plus the L_reg regulariser; not ReLA (variant 'rela', whose preset 'relu' "
        "is ReLA without norm)"
    )
    hyperparameters = (
        Hyperparameter("reluformer_scale", bool, True, "divide by the variance reduction factor gamma sqrt(n/2) "
                       "(Shen et al. 2023, Eq. 6); false = Table 5 '- scale factor' (diverges)",
                       symbol="gamma sqrt(n/2) (Eq. 6)"),
        Hyperparameter("reluformer_gamma", float, 1.0, "gamma in gamma sqrt(n/2) (Shen et al. 2023, Eq. 6 gives no "
                       "value)", low=0.0, low_open=True, symbol="gamma (Eq. 6)"),
        Hyperparameter("reluformer_reg_weight", float, 0.05, "weight of L_reg (Eq. 7) in the loss; Shen et al. 2023 "
                       "give none. 0.05: at weight 1 the attention collapses and BLEU falls far below softmax "
                       "(hf-attn's recipe sensitivity runs, docs/papers/reluformer.md); 0 = Table 5 '- reg loss'",
                       low=0.0,
                       symbol="the weight of L_reg (Eq. 7; no value in the paper)"),
        Hyperparameter("reluformer_entropy_bound", float, 0.7, "C = value * log n in L_reg's entropy margin (Shen et "
                       "al. 2023, Appendix A)", low=0.0, symbol="C = value * log n (Appendix A)"),
        Hyperparameter("reluformer_eps", float, 1e-6, "floor on the row sum before the log (an all-zero row has sum "
                       "0; not in Shen et al. 2023)", low=0.0, high=1e-2, low_open=True),
        Hyperparameter("reluformer_query_chunk", int, 256, "queries and keys per block of the block-wise path for "
                       "long inputs (linear memory, same values; Shen et al. 2023 use 512-2048-token documents); 0 = "
                       "never", low=0),
    )
    presets = (
        Preset(
            "reluformer",
            "ReLUFormer: ReLU attention with the variance reduction factor and L_reg at all sites (Table 4); L_reg "
            "weight 0.05, which the paper leaves open (weight 1 collapses the attention: docs/papers/reluformer.md)",
            RELUFORMER_PAPER,
            all_sites(VARIANT),
        ),
        Preset(
            "reluformer-no-scale",
            "ablation: ReLUFormer without the variance reduction factor (Table 5, '- scale factor'; diverges)",
            RELUFORMER_PAPER,
            all_sites(VARIANT, reluformer_scale=False),
        ),
        Preset(
            "reluformer-no-reg",
            "ablation: ReLUFormer without the regulariser L_reg (Table 5, '- reg loss'; = Table 2 ReLU + scale)",
            RELUFORMER_PAPER,
            all_sites(VARIANT, reluformer_reg_weight=0.0),
        ),
    )

    # ---- configuration ----------------------------------------------------------------------------------------
    def setup(self, config):
        self.use_scale = config.reluformer_scale
        self.gamma = float(config.reluformer_gamma)
        self.eps = float(config.reluformer_eps)
        self.entropy_bound = float(config.reluformer_entropy_bound)
        self.query_chunk = int(config.reluformer_query_chunk)
        self.regularised = float(config.reluformer_reg_weight) > 0

    # ---- forward ----------------------------------------------------------------------------------------------
    def attend(self, q, k, v, keep, ctx):
        out, weights, stats = reluformer_attention(
            q, k, v, keep, scaling=self.scaling, gamma=self.gamma, scale=self.use_scale, dropout=self.attn_dropout,
            eps=self.eps, entropy_bound=self.entropy_bound, need_weights=ctx.output_attentions, chunk=self.query_chunk,
            stats=self.wants_statistics(ctx), stats_grad=self.regularised,
            fused=dispatch(self, q, TRITON, ctx.output_attentions, triton_supports(q, k, keep)) == TRITON,
        )
        if stats is not None:  # per-row statistics for L_reg (`model_losses`)
            ctx.state.layer_stats[(self.variant, self.site, self.layer_idx)] = head_sums(stats)
        return out, weights

    @staticmethod
    def wants_statistics(ctx) -> bool:
        """L_reg's statistics are computed for a model forward pass, except during incremental decoding (a cache
        holding earlier target positions: L_reg of the new position is never used), and not for modules run outside
        the model's forward (the encoder inside ``generate``: no `ForwardState` to leave them in)."""
        return ctx.state is not None and not (ctx.cached and ctx.past > 0)

    # ---- model-level hooks --------------------------------------------------------------------------------------
    @staticmethod
    def query_validity(model, inputs) -> dict:
        """Which queries are real, per site: ``{"encoder": [B,S] | None, "decoder"/"cross": [B,T] | None}``.

        Source: ``attention_mask``. Target: ``decoder_attention_mask`` if given, else the decoder input ids (built
        from ``labels`` as the model does) that are not padding, the first position (the start token, which may
        equal pad in Marian) always real. The same whether the targets come as ``labels`` or as
        ``decoder_input_ids``, so L_reg does not depend on how the training loop hands them over.
        """
        src = inputs.get("attention_mask")
        src = src.bool() if src is not None else None
        tgt = inputs.get("decoder_attention_mask")
        if tgt is not None:
            tgt = tgt.bool()
        else:
            dec = inputs.get("decoder_input_ids")
            labels = inputs.get("labels")
            if dec is None and labels is not None:
                dec = model.prepare_decoder_input_ids_from_labels(labels=labels)
            if dec is not None and inputs.get(CACHE_KWARG) is None:
                tgt = dec.ne(model.config.pad_token_id)
                tgt[:, 0] = True
        return {"encoder": src, "decoder": tgt, "cross": tgt}

    @classmethod
    def training_objective(cls, config) -> bool:
        return float(config.reluformer_reg_weight) > 0  # L_reg (Eq. 7)

    @classmethod
    def model_losses(cls, model, out, inputs, state):
        """L_reg averaged over valid queries and heads per layer, then over layers; weighted into the loss."""
        layers = [(key[1], st) for key, st in state.layer_stats.items() if key[0] == cls.variant]
        if not layers:
            return {}, {}
        valid = cls.query_validity(model, inputs)
        per_layer = {key: [] for key in ("norm", "margin", "entropy", "row_sum")}
        for site, st in layers:  # `head_sums`: [B, T] sums over the heads
            rows = st["rows"].expand_as(st["norm"])
            qv = valid.get(site)
            if qv is not None and qv.shape == rows.shape:
                rows = rows & qv.to(rows.device)
            count = (rows.sum() * st["heads"]).clamp(min=1)
            for key, values in per_layer.items():
                values.append((st[key] * rows).sum() / count)
        mean = {key: torch.stack(values).mean() for key, values in per_layer.items()}
        reg = mean["norm"] + mean["margin"]  # Eq. 7, averaged over valid queries, heads and layers
        weight = float(model.config.reluformer_reg_weight)
        losses = {"reluformer_reg": weight * reg} if weight > 0 else {}
        logs = {
            "reg_loss": reg.detach(),
            "reg_norm_term": mean["norm"].detach(),
            "reg_entropy_term": mean["margin"].detach(),
            "attn_entropy": mean["entropy"].detach(),
            "attn_row_sum": mean["row_sum"].detach(),
        }
        return losses, logs
