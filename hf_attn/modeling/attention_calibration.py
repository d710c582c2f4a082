"""Attention calibration (Lu, Zeng, Zhang, Wu & Li 2021, "Attention Calibration for Transformer in Neural Machine
Translation", ACL). Official code: yulu-dada/Attention-calibration-NMT (fairseq); the defaults follow it, the
paper's formulas are options, and its bugs are fixed (each documented where it is fixed, below).

Two networks share the decoder: the NMT model (theta) and, in every calibrated decoder layer, a mask-perturbation
model (phi, the "attacker") with its own W_q, W_k (heads as in the layer). With x the input of the cross-attention
(decoder states) and h the encoder states:

    a    = softmax(q k^T / sqrt(dh))  over the real source tokens                       Eq. 1 (original weights)
    m    = sigmoid((x W_q)(h W_k)^T / sqrt(dh)),  m = 0 on padding                      Eq. 4 (mask in (0, 1))
    a_p  = m * a + (1 - m) * mu0,  mu0 = 1/J on the J real source tokens, 0 on padding  Eq. 3 (perturbed pass)
    a_c  = a * exp(1 - m)                                                              Eq. 7 (calibrated)
    fusion (calibration_fusion):
      fixed         a + lambda * a_c                     released code (lambda = 0.1, Section 4.2)
      fixed_softmax softmax(a + lambda * a_c)            the paper's Eq. 8 as printed (real tokens only)
      anneal        r a + (1 - r) a_c,  r = exp(-s / 1e5)   Eq. 9; s = optimiser step (see below)
      gate          g a + (1 - g) a_c,  g = sigmoid(W_g q + b_g)    Eq. 10; W_g: dh -> 1 on each head's scaled
                    query, shared by the heads (released code); calibration_gate_per_head=True: one per head (paper)

The released code spreads the removed mass (1 - m) a over *all* key slots, padding included (its mu0 is the row
mean over the padded length). Here mu0 is uniform over the real source tokens only: a_p and every fused weight
put exactly 0 on padding.

Training (Section 3.3) does two decoder passes over one encoder pass. The calibrated pass (the model's ordinary
forward) gives the translation loss L_nmt; the perturbed pass (all calibrated layers use a_p) gives CE_p:

    theta minimises L_nmt                                                        Eq. 11
    phi   minimises L_phi = -CE_p + alpha * ||1 - M||                            Eq. 5-6 (M: every mask of the
                                                                                 calibrated pass)

The released code needs two backward passes with ``requires_grad`` toggling. Here ONE loss carries both:

    L = L_nmt(theta, phi.detach()) + [L_phi(theta.detach(), phi) - L_phi.detach()]

* calibrated pass: the mask reads the live decoder / encoder states with *detached* W_q, W_k, so L_nmt reaches
  theta also through the mask (as in the released code) and never reaches phi;
* penalty: the same masks recomputed from *detached* states with the live W_q, W_k (phi only);
* perturbed pass: the decoder and output layer run with frozen theta parameters (``requires_grad`` off for the
  call, as the released code toggles it) on the detached encoder output, so CE_p reaches phi (through every
  layer's activations) and never theta;
* the bracket has value 0 and the gradient of L_phi, so the reported loss is the translation loss.

Any training loop that calls ``loss.backward()`` once, gradient accumulation, fp16/bf16 autocast, DDP (every
parameter gets its gradient from the single backward) and FSDP (the perturbed pass freezes theta inside each layer
call, where FSDP has gathered the layer's parameters) work unchanged. The perturbed pass needs the targets, so a
training forward needs ``labels``.

alpha rescaled for a mean-reduced loss. The released criterion is fairseq's: the label-smoothed CE is SUMMED over
the N target tokens of a batch, the penalty is ||1 - M||_2 / S (Frobenius norm over layers x heads x batch x
target x source, S = padded source length), alpha = 0.03, and fairseq divides the gradients by N. Its effective
objective is therefore -CE_mean + 0.03 * ||1 - M||_2 / (S * N), whose strength depends on the batch shape:
||1 - M||_2 = sqrt(L H N S) * rms(1 - M). Here the penalty is the batch-size independent

    P = rms(1 - M) = sqrt(mean over real (layer, head, target, source) entries of (1 - m)^2)

and L_phi = -CE_p(mean) + alpha * P, with alpha = 0.03 * sqrt(L H / (N S)) at the paper's geometry (Transformer
base L = 6 layers, H = 8 heads; --max-tokens 8192 per GPU, N ~ 8192 target tokens; S ~ 30 source tokens):
0.03 * sqrt(48 / 245760) = 4.2e-4 (``calibration_alpha``). CE_p is label smoothed with eps = 0.1 as in the
released criterion (``calibration_label_smoothing``). lambda (fixed fusion) weighs attention weights, not a loss,
so it needs no rescaling: 0.1.

Anneal: the training loop calls ``model.set_training_step(step)`` before every optimiser step; each calibrated module
keeps the step in a persistent int64 buffer ``calibration_step`` that is saved with the weights, so a saved model
decodes with r of its last training step (the released code hard-codes the value of step 150k at load time).

Inference decodes with the fused weights (one pass; the mask network runs, no perturbed pass). The masks are a
saliency map (small m = decisive source token): ``hf_attn.analysis.calibration``.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention_base import VariantAttention
from .citations import CITATIONS
from .forward_state import FORWARD_STATE_KWARG, ForwardState
from .hyperparameters import Hyperparameter, Preset
from .fused import TRITON, dispatch
from .kernels import float32_autocast_off, weighted_values
from .triton_calibration import calibrated_attention

CALIBRATION_PAPER = CITATIONS["calibration"]
FUSIONS = ("fixed", "fixed_softmax", "anneal", "gate")
# 0.03 (released --mask-loss-weight) * sqrt(L H / (N S)) with L=6, H=8, N=8192, S=30: see the module docstring
PAPER_ALPHA_SUMMED = 0.03
DEFAULT_ALPHA = round(PAPER_ALPHA_SUMMED * math.sqrt(6 * 8 / (8192 * 30)), 5)  # 0.00042


def _cut(t: torch.Tensor) -> torch.Tensor:
    """Where one objective's gradient must stop (tests swap it for the identity to rebuild the released recipe)."""
    return t.detach()


def _calibrated(**extra) -> dict:
    """Preset overrides: calibrated cross-attention, softmax self-attention (the paper's setting)."""
    return {"encoder_attention": "softmax", "decoder_attention": "softmax", "cross_attention": "calibrated", **extra}


class CalibratedAttention(VariantAttention):
    """Softmax cross-attention recalibrated by a jointly trained mask-perturbation model (Lu et al. 2021)."""

    variant = "calibrated"
    description = (
        "cross-attention recalibrated by a jointly trained mask-perturbation model: a * exp(1 - m) fused with a "
        "(Lu et al. 2021)"
    )
    sites = ("cross",)
    hyperparameters = (
        Hyperparameter("calibration_fusion", str, "gate", "fusion of a and a_c: fixed (Eq. 8 as released), "
                       "fixed_softmax (Eq. 8 as printed), anneal (Eq. 9), gate (Eq. 10) (Lu et al. 2021)",
                       choices=FUSIONS, symbol="the fusion of a and a_c (Eqs. 8-10)"),
        Hyperparameter("calibration_lambda", float, 0.1, "weight of a_c in the fixed fusion (Lu et al. 2021, Sec. "
                       "4.2)", low=0.0, symbol="lambda (Eq. 8)"),
        Hyperparameter("calibration_anneal_steps", float, 100000.0, "T in r = exp(-step / T) of the anneal fusion "
                       "(Lu et al. 2021, Eq. 9: 1e5 optimiser steps)", low=0.0, low_open=True,
                       symbol="T in r = exp(-step / T) (Eq. 9)"),
        Hyperparameter("calibration_alpha", float, DEFAULT_ALPHA, "mask penalty weight (Lu et al. 2021, Eq. 5: 0.03 "
                       "for a summed loss, rescaled for a mean loss)", low=0.0, symbol="alpha (Eq. 5)"),
        Hyperparameter("calibration_gate_per_head", bool, False, "one gate W_g per head (Lu et al. 2021, Eq. 10) "
                       "instead of one shared over heads (released code)", symbol="W_g per head (Eq. 10)"),
        Hyperparameter("calibration_label_smoothing", float, 0.1, "label smoothing of CE_p in the perturbation loss "
                       "(released criterion of Lu et al. 2021: 0.1; 0 = plain CE)", low=0.0, high=1.0, high_open=True),
    )
    presets = (
        Preset(
            "calibration-fixed",
            "attention calibration, fixed weighted sum a + 0.1 a_c (Section 3.2, Eq. 8; Tables 2-4 'Fixed')",
            CALIBRATION_PAPER,
            _calibrated(calibration_fusion="fixed"),
        ),
        Preset(
            "calibration-anneal",
            "attention calibration, annealing r a + (1-r) a_c, r = exp(-step/T) (Eq. 9; Tables 2-4 'Anneal'); the "
            "paper's T = 1e5 is for 150k steps: set calibration_anneal_steps ~ 2/3 of a shorter budget (see the "
            "docs/papers/calibration.md), or r stays ~1 and the run is the baseline",
            CALIBRATION_PAPER,
            _calibrated(calibration_fusion="anneal"),
        ),
        Preset(
            "calibration-gate",
            "attention calibration, gating g a + (1-g) a_c (Eq. 10; Tables 2-4 'Gate', the paper's best)",
            CALIBRATION_PAPER,
            _calibrated(calibration_fusion="gate"),
        ),
    )

    # ---- configuration ----------------------------------------------------------------------------------------
    def setup(self, config):
        self.fusion = config.calibration_fusion
        self.calibration_lambda = float(config.calibration_lambda)
        self.anneal_steps = float(config.calibration_anneal_steps)
        self.gate_per_head = config.calibration_gate_per_head
        d, h, dh = self.embed_dim, self.num_heads, self.head_dim
        # phi: the mask-perturbation model of this layer (Eq. 4), heads as in the layer
        self.perturb_q_proj = nn.Linear(d, d, bias=True)
        self.perturb_k_proj = nn.Linear(d, d, bias=True)
        if self.fusion == "gate":  # Eq. 10 (part of theta: trained by the translation loss)
            if self.gate_per_head:
                self.calibration_gate_weight = nn.Parameter(torch.empty(h, dh))
                self.calibration_gate_bias = nn.Parameter(torch.empty(h))
            else:
                self.calibration_gate = nn.Linear(dh, 1)
        if self.fusion == "anneal":  # Eq. 9: the optimiser step, saved with the weights (int64: exact, never cast)
            self.register_buffer("calibration_step", torch.zeros((), dtype=torch.long), persistent=True)

    def init_variant_weights(self, init):
        """phi: xavier-uniform with gain 1/sqrt(2), zero biases (fairseq MultiheadAttention); gate: U(+-1/sqrt(dh)),
        zero bias (g = 0.5 on average at the start); anneal step 0."""
        for lin in (self.perturb_q_proj, self.perturb_k_proj):
            init.xavier_uniform_(lin.weight, gain=1 / math.sqrt(2))
            init.zeros_(lin.bias)
        bound = 1 / math.sqrt(self.head_dim)
        if self.fusion == "gate":
            if self.gate_per_head:
                init.uniform_(self.calibration_gate_weight, -bound, bound)
                init.zeros_(self.calibration_gate_bias)
            else:
                init.uniform_(self.calibration_gate.weight, -bound, bound)
                init.zeros_(self.calibration_gate.bias)
        if self.fusion == "anneal":
            init.zeros_(self.calibration_step)

    def phi_parameters(self) -> list[nn.Parameter]:
        """The mask-perturbation model's parameters (phi); every other parameter of the model is theta."""
        return [*self.perturb_q_proj.parameters(), *self.perturb_k_proj.parameters()]

    # ---- step-driven schedule ---------------------------------------------------------------------------------
    def set_training_step(self, step: int) -> None:
        if self.fusion == "anneal":
            with torch.no_grad():
                self.calibration_step.fill_(int(step))

    def anneal_ratio(self) -> torch.Tensor:
        """r = exp(-step / 1e5) (Eq. 9), a 0-dim float32 tensor (no host sync)."""
        return torch.exp(-self.calibration_step.float() / self.anneal_steps)

    # ---- forward ----------------------------------------------------------------------------------------------
    def attend(self, q, k, v, keep, ctx):
        details = ctx.state is not None and ctx.state.details is not None
        supported = self.fusion != "fixed_softmax" and keep.explicit is None and not keep.causal
        if dispatch(self, q, TRITON, ctx.output_attentions or details, supported) == TRITON:
            return self.attend_fused(q, k, v, keep, ctx), None
        weights = self.calibrated_weights(q, k, keep, ctx)
        return weighted_values(weights, v, self.attn_dropout, self.training, ctx.output_attentions)

    def attend_fused(self, q, k, v, keep, ctx):
        """dropout(w) V with w as `calibrated_weights` gives it, by the Triton kernel (`triton_calibration`): no
        [B,H,T,S] tensor; the penalty and mask sums of `_statistics` come from the same pass. Every fusion but
        fixed_softmax (whose softmax over the fused weights needs them whole), a padding-only mask."""
        x, enc, state = ctx.hidden_states, ctx.key_value_states, ctx.state
        perturbed = state is not None and state.mode == "perturbed"
        training = self.training and torch.is_grad_enabled()
        real = keep.real_keys()  # [B|1, 1, 1, S]
        with float32_autocast_off(q):  # q', k' and the gains in float32, as `calibrated_weights`
            qp, kp = self.perturbation_projections(x, enc, "live" if perturbed or not training else "nmt", ctx)
            stats = training and not perturbed and state is not None
            phi = [t.to(q.dtype) for t in self.perturbation_projections(x, enc, "phi")] if stats else None
            gain_a, gain_c, g = (None, None, None) if perturbed else self.gains(q.float() * self.scaling)
        o, psq, msum = calibrated_attention(
            q, k, v, qp.to(q.dtype), kp.to(q.dtype), real.view(-1, keep.k_len).expand(q.shape[0], -1), gain_a,
            gain_c, "perturbed" if perturbed else "calibrated", self.attn_dropout, phi)
        if stats:
            state.layer_stats[(self.variant, self.site, self.layer_idx)] = self._statistics(
                x, enc, real, None, g, sums=(psq, msum))
            if self.fusion == "anneal":
                state.log("calibration_anneal_ratio", self.anneal_ratio())
        return o

    def perturbation_mask(self, x, enc, real, view: str, ctx=None) -> torch.Tensor:
        """m = sigmoid(q' k'^T / sqrt(dh)) (Eq. 4), float32 [B,H,T,S], exactly 0 on padding.

        view "nmt": detached W_q, W_k on the live states (L_nmt reaches theta through m, never phi);
        view "phi": live W_q, W_k on detached states (the penalty reaches phi only);
        view "live": both live (perturbed pass, whose theta parameters are already detached; inference).
        During cached decoding (``ctx`` with a cache, no autograd) k' is computed once and kept in the cache.
        """
        qp, kp = self.perturbation_projections(x, enc, view, ctx)
        return torch.sigmoid(torch.matmul(qp * self.scaling, kp.transpose(-1, -2))) * real

    def perturbation_projections(self, x, enc, view: str, ctx=None):
        """(q' [B,H,T,dh], k' [B,H,S,dh]) of Eq. 4, float32, with the gradient routing of ``view``
        (`perturbation_mask`); k' kept in the cache during cached decoding."""
        wq, bq = self.perturb_q_proj.weight, self.perturb_q_proj.bias
        wk, bk = self.perturb_k_proj.weight, self.perturb_k_proj.bias
        if view == "nmt":
            wq, bq, wk, bk = _cut(wq), _cut(bq), _cut(wk), _cut(bk)
        elif view == "phi":
            x, enc = _cut(x), _cut(enc)
        bsz, tgt = x.shape[:2]
        qp = F.linear(x.float(), wq.float(), bq.float()).view(bsz, tgt, -1, self.head_dim).transpose(1, 2)
        cached = ctx is not None and ctx.cached and not torch.is_grad_enabled()
        name = f"calibration_keys.{self.layer_idx}"
        kp = ctx.cache.get_state(name) if cached and ctx.past > 0 else None
        if kp is None:
            kp = F.linear(enc.float(), wk.float(), bk.float()).view(enc.shape[0], enc.shape[1], -1, self.head_dim)
            kp = kp.transpose(1, 2)
            if cached:
                ctx.cache.set_state(name, kp)
        return qp, kp

    def calibrated_weights(self, q, k, keep, ctx) -> torch.Tensor:
        """The weights this layer attends with: fused (calibrated pass, inference) or a_p (perturbed pass)."""
        x, enc, state = ctx.hidden_states, ctx.key_value_states, ctx.state
        with float32_autocast_off(q):
            real = keep.real_keys()  # [B|1, 1, 1, S]
            qs = q.float() * self.scaling  # the scaled query: the scores' and the released gate's input
            scores = torch.matmul(qs, k.float().transpose(-1, -2))
            scores = keep.fill_hidden(scores, torch.finfo(scores.dtype).min)
            a = torch.softmax(scores, dim=-1)  # Eq. 1
            if state is not None and state.mode == "perturbed":
                m = self.perturbation_mask(x, enc, real, "live")
                mu0 = real / real.sum(-1, keepdim=True).clamp(min=1)  # uniform over the real tokens only
                w = m * a + (1 - m) * mu0  # Eq. 3
                state.record(self.site, self.layer_idx, {"perturbed": w, "perturbed_mask": m, "perturbed_attention": a})
                return w
            training = self.training and torch.is_grad_enabled()
            m = self.perturbation_mask(x, enc, real, "nmt" if training else "live", ctx)
            a_c = a * torch.exp(1 - m)  # Eq. 7
            w, g = self.fuse(a, a_c, qs, keep)
            if state is not None:
                if state.details is not None:
                    maps = {"attention": a, "mask": m, "calibrated": a_c, "combined": w}
                    state.record(self.site, self.layer_idx, {**maps, "gate": None if g is None else g.squeeze(-1)})
                if training:
                    state.layer_stats[(self.variant, self.site, self.layer_idx)] = self._statistics(x, enc, real, m, g)
                    if self.fusion == "anneal":
                        state.log("calibration_anneal_ratio", self.anneal_ratio())
        return w

    def fuse(self, a, a_c, qs, keep):
        """(a_comb, gate or None), Eq. 8-10; ``qs``: the scaled query q / sqrt(dh), float32."""
        if self.fusion == "fixed":  # released code
            return a + self.calibration_lambda * a_c, None
        if self.fusion == "fixed_softmax":  # Eq. 8 as printed, over the real source tokens
            mixed = keep.fill_hidden(a + self.calibration_lambda * a_c, torch.finfo(a.dtype).min)
            return torch.softmax(mixed, dim=-1), None  # exactly 0 on the hidden keys (exp of the minimum)
        if self.fusion == "anneal":  # Eq. 9
            r = self.anneal_ratio()
            return r * a + (1 - r) * a_c, None
        g = self.gate(qs)
        return g * a + (1 - g) * a_c, g

    def gains(self, qs):
        """(G, H, gate or None): the fused weights written a (G + H exp(1 - m)) (Eq. 7 in Eq. 8 as released, 9, 10),
        G and H per query row ([B,H,T] tensors, 0-dim tensors or floats)."""
        if self.fusion == "fixed":
            return 1.0, self.calibration_lambda, None
        if self.fusion == "anneal":
            r = self.anneal_ratio()
            return r, 1 - r, None
        g = self.gate(qs)
        return g.squeeze(-1), 1 - g.squeeze(-1), g

    def gate(self, qs):
        """g = sigmoid(W_g q + b_g) (Eq. 10), [B, H, T, 1], on the scaled query ``qs``."""
        if self.gate_per_head:  # the released gate reads the scaled query of each head
            logit = torch.einsum("bhtd,hd->bht", qs, self.calibration_gate_weight.float())
            logit = (logit + self.calibration_gate_bias.float()[:, None])[..., None]
        else:
            logit = F.linear(qs, self.calibration_gate.weight.float(), self.calibration_gate.bias.float())
        return torch.sigmoid(logit)  # Eq. 10, [B, H, T, 1]

    def _statistics(self, x, enc, real, m_nmt, g, sums=None) -> dict:
        """Per target position sums for the model-level objective: penalty (phi view), mean mask, gate; ``sums``:
        the fused kernel's (penalty, mask sum) per head [B,H,T] instead of ``m_nmt``."""
        if sums is None:
            m_phi = self.perturbation_mask(x, enc, real, "phi")
            sq = ((1 - m_phi).square() * real).sum(dim=(1, 3))  # [B, T]  (Eq. 6 over heads and real sources)
            mask_sum = (m_nmt.detach() * real).sum(dim=(1, 3))
        else:
            sq, mask_sum = sums[0].sum(1), sums[1].sum(1)
        n = (real.sum(dim=(1, 3)) * self.num_heads).expand_as(sq)  # [B, T] entries per target position
        stats = {"penalty_sq": sq, "count": n, "mask_sum": mask_sum}
        if g is not None:
            stats["gate_sum"] = g.detach().squeeze(-1).sum(1)  # [B, T]
        return stats

    def extra_repr(self) -> str:
        extra = {"fixed": f", lambda={self.calibration_lambda}", "fixed_softmax": f", lambda={self.calibration_lambda}"}
        return f"{super().extra_repr()}, fusion={self.fusion}{extra.get(self.fusion, '')}"

    # ---- the model-level objective ------------------------------------------------------------------------------
    @classmethod
    def training_objective(cls, config) -> bool:
        return True  # the mask-perturbation objective L_phi (Eq. 5-6)

    @classmethod
    def attach(cls, model):
        """The decoder layers freeze theta during the perturbed pass (see `perturbed_pass`)."""
        for layer in model.model.decoder.layers:
            layer.register_forward_pre_hook(_freeze_theta, with_kwargs=True)
            layer.register_forward_hook(_thaw_theta, with_kwargs=True, always_call=True)

    @classmethod
    def needs_training_step(cls, config) -> bool:
        return config.calibration_fusion == "anneal"  # Eq. 9: r = exp(-step / T)

    @classmethod
    def model_losses(cls, model, out, inputs, state):
        """({"calibration": L_phi - L_phi.detach()}, logs) while training; nothing otherwise (see the docstring)."""
        stats = [st for key, st in state.layer_stats.items() if key[0] == cls.variant]
        if not (model.training and torch.is_grad_enabled()) or not stats:
            return {}, {}
        targets = inputs.get("labels")  # training always has them (the model checks before the forward pass)
        if targets is None:
            return {}, {}
        valid = targets.ne(-100).float()  # [B, T]
        n_tokens = valid.sum().clamp(min=1)
        count = sum((s["count"] * valid).sum() for s in stats).clamp(min=1)
        penalty = torch.sqrt(sum((s["penalty_sq"] * valid).sum() for s in stats) / count + 1e-12)  # rms(1 - M)
        logs = {
            "mean_mask": sum((s["mask_sum"] * valid).sum() for s in stats) / count,
            "mask_penalty": penalty.detach(),
        }
        if "gate_sum" in stats[0]:
            gates = sum((s["gate_sum"] * valid).sum() for s in stats)
            logs["calibration_gate"] = gates / (n_tokens * model.config.decoder_attention_heads * len(stats))
        logs["translation_loss"] = out.loss.detach()  # the base model's cross-entropy of these labels
        smoothed, nll = perturbed_pass(model, out, inputs, targets, model.config.calibration_label_smoothing, state)
        logs["perturbed_loss"] = nll.detach()
        objective = -smoothed + model.config.calibration_alpha * penalty  # Eq. 5
        logs["perturbation_objective"] = objective.detach()
        return {"calibration": objective - objective.detach()}, logs


# ---- model-level helpers --------------------------------------------------------------------------------------
def calibrated_modules(model) -> list:
    """The calibrated cross-attention modules of an hf-attn model, in layer order (also with remote code)."""
    return [m for m in model.attention_modules("cross") if getattr(m, "variant", None) == "calibrated"]


def perturbed_pass(model, out, inputs, targets, label_smoothing: float = 0.0, state: ForwardState | None = None):
    """CE_p of the perturbed pass: (label-smoothed mean, plain mean NLL) over the real target tokens.

    Decoder and output layer run with frozen theta on the detached encoder output; only phi (W_q, W_k of every
    layer) is live, so the gradient of CE_p reaches phi alone, through every layer's activations (`_decoder_pass`)."""
    decoder = model.get_decoder()
    dec_ids, dec_embeds = inputs.get("decoder_input_ids"), inputs.get("decoder_inputs_embeds")
    if dec_ids is None and dec_embeds is None:
        dec_ids = model.prepare_decoder_input_ids_from_labels(inputs["labels"])
    kwargs = {
        "input_ids": dec_ids if dec_embeds is None else None,
        "inputs_embeds": _cut(dec_embeds) if dec_embeds is not None else None,
        "attention_mask": inputs.get("decoder_attention_mask"),
        "encoder_hidden_states": _cut(out.encoder_last_hidden_state),
        "encoder_attention_mask": inputs.get("attention_mask"),
        "use_cache": False,
        "return_dict": True,
        # every calibrated layer uses a_p in this pass; its maps join the caller's details
        FORWARD_STATE_KWARG: ForwardState(details=state.details if state is not None else None, mode="perturbed"),
    }
    hidden = _decoder_pass(decoder, kwargs)
    head = model.get_output_embeddings()
    logits = F.linear(hidden, _cut(head.weight), None if head.bias is None else _cut(head.bias))
    if getattr(model, "final_logits_bias", None) is not None:
        logits = logits + model.final_logits_bias
    logp = torch.log_softmax(logits.float(), dim=-1)
    valid = targets.ne(-100)
    nll = -logp.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1)
    smooth = -logp.mean(-1)
    n = valid.sum().clamp(min=1)
    nll_mean = (nll * valid).sum() / n
    smoothed = ((1 - label_smoothing) * nll + label_smoothing * smooth) * valid
    return smoothed.sum() / n, nll_mean


def _decoder_pass(decoder, kwargs: dict) -> torch.Tensor:
    """The decoder's last hidden state with theta frozen: the decoder's own parameters (embeddings, norms) around
    the call, each layer's by `_freeze_theta` inside the layer's call (where FSDP has gathered them).

    Under gradient checkpointing a layer recomputes its forward in the backward pass, outside its module hooks and
    after the parameters have thawed: that recomputation would differ from the pass it replays. So the layers' own
    checkpointing is off here and the whole pass is checkpointed once, the freezing inside its recomputation too."""
    layers = [m for m in decoder.modules() if getattr(m, "gradient_checkpointing", False)]
    outside_layers = [p for n, p in decoder.named_parameters() if not n.startswith("layers.")]

    def run():
        for m in layers:
            m.gradient_checkpointing = False
        try:
            with _frozen(outside_layers):
                return decoder(**kwargs).last_hidden_state
        finally:
            for m in layers:
                m.gradient_checkpointing = True

    if layers and decoder.training and torch.is_grad_enabled():
        return checkpoint(run, use_reentrant=False)
    return run()


def _freeze(params) -> list:
    """``requires_grad`` off for those of ``params`` that have it (the released code's toggling); returns them."""
    frozen = [p for p in params if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    return frozen


def _thaw(frozen: list) -> None:
    for p in frozen:
        p.requires_grad_(True)


@contextlib.contextmanager
def _frozen(params):
    frozen = _freeze(params)
    try:
        yield
    finally:
        _thaw(frozen)


def _freeze_theta(layer, args, kwargs):
    """Forward pre-hook of each decoder layer: in the perturbed pass, the layer's theta parameters are frozen for the
    call (phi stays live). Under FSDP the layer's parameters exist, gathered, only from this point of its call."""
    state = kwargs.get(FORWARD_STATE_KWARG)
    if state is not None and state.mode == "perturbed":
        phi = {id(p) for m in layer.modules() if isinstance(m, CalibratedAttention) for p in m.phi_parameters()}
        state.frozen[id(layer)] = _freeze(p for p in layer.parameters() if id(p) not in phi)


def _thaw_theta(layer, args, kwargs, output):
    """Forward hook (also after an exception): what `_freeze_theta` froze trains again."""
    state = kwargs.get(FORWARD_STATE_KWARG)
    if state is not None:
        _thaw(state.frozen.pop(id(layer), []))
