"""The attention weights each variant must return, recomputed from a layer's inputs by the papers' equations.

`capture` records what every attention module of a model receives (its input states and, for cross-attention,
the encoder states) through forward pre-hooks; `recompute` turns one such record into the weights the variant's
equation gives, from the module's parameters and a keep mask built from the batch alone. Nothing here calls a
variant's ``attend`` or reads the weights it returns: `check_weights` compares the model's ``output_attentions``
with this recomputation, so a variant that returned any other weights (softmax's, say) fails it.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax

from hf_attn.modeling.attention_gmm import SYNTHESIS_MAX_LOG_STEP, SYNTHESIS_MAX_LOG_WEIGHT
from hf_attn.modeling.hyperparameters import SITES

OUTPUT_FIELD = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}
# weights that depend on positions only (the tokens never reach them)
POSITION_ONLY = {"recurrent", "hard-gaussian", "synthesizer"}
# the optimiser step the checks run at: attention calibration's anneal fusion mixes in a_c only after step 0
ANNEAL_STEP = 50_000
ATOL, RTOL = 2e-5, 1e-4
MASKED = -1e6  # a finite fill for the sparse normalisers (an -inf would turn into NaN inside 1.5-entmax)


@contextlib.contextmanager
def capture(model):
    """Yields {(site, layer): {"x": input states [B,T,d], "kv": encoder states [B,S,d] or None}}, filled by the
    model's next forward pass."""
    seen: dict = {}
    handles = []
    for site in SITES:
        for layer, module in enumerate(model.attention_modules(site)):
            def hook(mod, args, kwargs, key=(site, layer)):
                x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
                seen[key] = {"x": x.detach(), "kv": kwargs.get("key_value_states")}
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def keep_masks(batch: dict, tgt_len: int) -> dict:
    """Bool keep masks [B, 1, T, S] per site, from the batch: source padding; causal target (no target padding
    mask is given, as in training with labels); source padding for cross-attention."""
    src = batch["attention_mask"].bool()
    b, s = src.shape
    causal = torch.ones(tgt_len, tgt_len, dtype=torch.bool).tril()
    return {
        "encoder": src[:, None, None, :].expand(b, 1, s, s),
        "decoder": causal[None, None].expand(b, 1, tgt_len, tgt_len),
        "cross": src[:, None, None, :].expand(b, 1, tgt_len, s),
    }


def heads(module, states, proj) -> torch.Tensor:
    """[B, H, L, dh] from ``proj(states)``."""
    return proj(states).view(*states.shape[:2], module.num_heads, module.head_dim).transpose(1, 2)


def queries_keys(module, record):
    """q (unscaled) and k of the record, through the module's own projections."""
    source = record["x"] if record["kv"] is None else record["kv"]
    return heads(module, record["x"], module.q_proj), heads(module, source, module.k_proj)


def masked_softmax(scores, keep):
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)


def dot_softmax(module, record, keep):
    """softmax(q k^T / sqrt(dh)) over the visible keys (Vaswani et al. 2017, Eq. 1)."""
    q, k = queries_keys(module, record)
    return masked_softmax(q @ k.transpose(-1, -2) / math.sqrt(module.head_dim), keep)


# ---- one function per variant: the weights of its equation ----------------------------------------------------
def softmax_weights(module, record, keep, config):
    return dot_softmax(module, record, keep)


def sparse_weights(normaliser):
    def weights(module, record, keep, config):
        q, k = queries_keys(module, record)
        scores = (q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)).masked_fill(~keep, MASKED)
        return normaliser(scores, dim=-1)  # the `entmax` package

    return weights


def rela_weights(module, record, keep, config):
    """ReLA, Zhang et al. 2021, Eq. 3: act(q k^T / sqrt(dh)) times the 0/1 mask (the output norm of Eq. 4-5
    acts after the weights)."""
    q, k = queries_keys(module, record)
    scores = q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)
    act = {"relu": F.relu, "gelu": F.gelu,
           "leaky_relu": lambda x: F.leaky_relu(x, config.rela_leaky_relu_slope)}[config.rela_activation]
    return act(scores) * keep


def reluformer_weights(module, record, keep, config):
    """ReLUFormer, Shen et al. 2023, Eq. 5-6: relu(q k^T / sqrt(dh)) / (gamma sqrt(n_i / 2)), n_i visible keys."""
    q, k = queries_keys(module, record)
    s = F.relu(q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)) * keep
    if config.reluformer_scale:
        s = s / (config.reluformer_gamma * torch.sqrt(keep.sum(-1, keepdim=True) / 2))
    return s


def gmm_weights(module, record, keep, config):
    """GMM cross-attention, Zhang & Feng 2021, Eq. 1-2, 6 and 10-14 (and the Table 1 normalisations)."""
    q, _ = queries_keys(module, record)
    real = keep[:, :, :1, :].float()  # [B, 1, 1, S]
    length = real.sum(-1, keepdim=True)  # J
    j = real.cumsum(-1) - 1  # positions among the real tokens
    kk = config.gmm_num_components
    fusion, norm = config.gmm_fusion, config.gmm_normalization

    def ffn(name):  # Eq. 7-9, 14: V^T tanh(W^T q + b1) + b2, one per quantity, shared by the heads
        f = getattr(module, f"gmm_{name}")
        return f.out(torch.tanh(f.hidden(q)))

    alpha = dot_softmax(module, record, keep) if fusion != "gmm_only" else None
    if fusion == "dot":
        return alpha
    shape = (*q.shape[:-1], kk)
    if norm == "synthesis":  # Graves 2013: w = exp(.), mu_i = mu_{i-1} + exp(.), sigma = sqrt(exp(-.) / 2), Z = 1
        w = ffn("weight").clamp(max=SYNTHESIS_MAX_LOG_WEIGHT - math.log(kk)).exp().expand(shape)
        mu = ffn("mean").clamp(max=SYNTHESIS_MAX_LOG_STEP).exp().expand(shape).cumsum(dim=2)
        sigma = torch.sqrt(torch.exp(-ffn("sigma")) / 2).clamp(min=config.gmm_sigma_min).expand(shape)
        z = torch.ones_like(sigma)
    else:
        if config.gmm_share_weight:
            w = torch.full(shape, 1 / kk)
        else:
            w = torch.softmax(ffn("weight"), dim=-1)  # Eq. 10
        mu = (length * torch.sigmoid(ffn("mean"))).expand(shape)  # Eq. 11
        raw_sigma = torch.sigmoid(ffn("sigma"))
        if norm == "approximate":  # Eq. 12
            sigma = torch.minimum(length / 6 * raw_sigma, torch.minimum(mu, length - mu) / 3)
        else:  # strict: sigma = J sigmoid(.)
            sigma = (length * raw_sigma).expand(shape)
        sigma = sigma.clamp(min=config.gmm_sigma_min)
        z = torch.sqrt(2 * math.pi * sigma.square())
    density = torch.exp(-(j[..., None, :] - mu[..., None]).square() / (2 * sigma[..., None].square()))
    beta = ((w / z)[..., None] * density).sum(-2) * real  # Eq. 6, [B, H, T, S]
    if norm == "strict":
        beta = beta / beta.sum(-1, keepdim=True)
    if fusion == "gate":
        g = torch.sigmoid(ffn("gate"))  # Eq. 14
        return (1 - g) * alpha + g * beta  # Eq. 13
    if fusion == "average":
        return (alpha + beta) / 2
    return beta


def calibrated_weights(module, record, keep, config):
    """Attention calibration, Lu et al. 2021: a (Eq. 1), m (Eq. 4), a_c = a exp(1 - m) (Eq. 7), fused (Eq. 8-10)."""
    q, k = queries_keys(module, record)
    real = keep[:, :, :1, :].float()
    qs = q / math.sqrt(module.head_dim)
    a = masked_softmax(qs @ k.transpose(-1, -2), keep)
    qp = heads(module, record["x"], module.perturb_q_proj)
    kp = heads(module, record["kv"], module.perturb_k_proj)
    m = torch.sigmoid(qp @ kp.transpose(-1, -2) / math.sqrt(module.head_dim)) * real
    a_c = a * torch.exp(1 - m)
    fusion, lam = config.calibration_fusion, config.calibration_lambda
    if fusion == "fixed":
        return a + lam * a_c
    if fusion == "fixed_softmax":
        return masked_softmax(a + lam * a_c, keep)
    if fusion == "anneal":  # Eq. 9, r = exp(-step / T)
        r = math.exp(-ANNEAL_STEP / config.calibration_anneal_steps)
        return r * a + (1 - r) * a_c
    if config.calibration_gate_per_head:
        logit = torch.einsum("bhtd,hd->bht", qs, module.calibration_gate_weight) + module.calibration_gate_bias[:, None]
        g = torch.sigmoid(logit)[..., None]
    else:
        g = torch.sigmoid(module.calibration_gate(qs))
    return g * a + (1 - g) * a_c  # Eq. 10


def recurrent_weights(module, record, keep, config):
    """RAN, Zeng et al. 2021: A_l = A_{l-1} + Rec(A_{l-1}) from the stack's A_0 (Eq. 3-4), softmax(A_l) (Eq. 2)."""
    stack = module.ran_stack
    rec = stack.transition
    a = stack.initial_attention
    for _ in range(module.ran_step + 1):
        if config.ran_transition == "ffn":
            a = a + rec.fc2(F.relu(rec.fc1(a)))
        else:
            a = a + rec.norm(torch.tanh(rec.linear(a)))
    t, s = keep.shape[-2:]
    return masked_softmax(a[:, :t, :s].expand(keep.shape[0], -1, -1, -1), keep)


def hard_gaussian_weights(module, record, keep, config):
    """You et al. 2020: N(j; c_h(i), sigma^2) at the visible key positions; c_h(i) = i + offset_h (self-attention),
    clamp(i r + offset_h, 0, J - 1) (cross-attention); source positions count real tokens."""
    b, _, t, s = keep.shape
    site = module.site
    offsets = list(getattr(config, f"hard_gaussian_{site}_offsets"))
    off = torch.tensor([float(offsets[h % len(offsets)]) for h in range(module.num_heads)])[None, :, None, None]
    real = keep[:, :, :1, :].float()
    key_pos = torch.arange(s, dtype=torch.float32).expand(b, 1, 1, s) if site == "decoder" else real.cumsum(-1) - 1
    if site == "encoder":
        centre = key_pos.transpose(-1, -2) + off
    elif site == "decoder":
        centre = torch.arange(t, dtype=torch.float32)[None, None, :, None] + off
    else:
        last = real.sum(-1, keepdim=True) - 1
        centre = torch.minimum((torch.arange(t)[None, None, :, None] * config.hard_gaussian_length_ratio + off)
                               .clamp(min=0), last)
    std = config.hard_gaussian_std
    density = torch.exp(-(key_pos - centre).square() / (2 * std**2)) / (std * math.sqrt(2 * math.pi))
    if config.hard_gaussian_normalize:
        return masked_softmax(density.log(), keep)
    return density * keep


def synthesizer_weights(module, record, keep, config):
    """Random Synthesizer, Tay et al. 2021: softmax(R[:, :T, :S]) over the visible keys."""
    t, s = keep.shape[-2:]
    return masked_softmax(module.synthesizer_logits[:, :t, :s].expand(keep.shape[0], -1, -1, -1), keep)


EQUATIONS = {
    "softmax": softmax_weights,
    "sparsemax": sparse_weights(sparsemax),
    "entmax15": sparse_weights(entmax15),
    "rela": rela_weights,
    "reluformer": reluformer_weights,
    "gmm": gmm_weights,
    "calibrated": calibrated_weights,
    "recurrent": recurrent_weights,
    "hard-gaussian": hard_gaussian_weights,
    "synthesizer": synthesizer_weights,
}


def forward_with_inputs(model, batch):
    """(output with attentions, {(site, layer): record}, keep masks) of one eval forward pass."""
    model.set_training_step(ANNEAL_STEP)
    with torch.no_grad(), capture(model) as seen:
        out = model(**batch, output_attentions=True)
    return out, seen, keep_masks(batch, out.decoder_attentions[0].shape[-1])


def check_weights(model, batch) -> int:
    """Assert that every returned weight map equals its variant's equation on the captured inputs; returns how many
    maps were compared."""
    out, seen, keep = forward_with_inputs(model, batch)
    layout = model.config.attention_layout()
    compared = 0
    for site in SITES:
        returned = getattr(out, OUTPUT_FIELD[site])
        modules = model.attention_modules(site)
        assert len(returned) == len(modules) == len(layout[site]), site
        for layer, (module, got) in enumerate(zip(modules, returned)):
            variant = module.variant
            assert variant == layout[site][layer], (site, layer, variant)
            with torch.no_grad():
                want = EQUATIONS[variant](module, seen[(site, layer)], keep[site], model.config)
            torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL,
                                       msg=lambda m, s=site, l=layer, v=variant: f"{s} layer {l} ({v}): {m}")
            compared += 1
    return compared


def check_family(model, batch, other_batch) -> None:
    """What sets each variant apart from softmax on the same q and k, mathematically: ``other_batch`` has the same
    mask and other tokens (position-only weights must not change with it, token-dependent ones must)."""
    out, seen, keep = forward_with_inputs(model, batch)
    other, _, _ = forward_with_inputs(model, other_batch)
    for site in SITES:
        for layer, module in enumerate(model.attention_modules(site)):
            w = getattr(out, OUTPUT_FIELD[site])[layer]
            where = f"{site} layer {layer} ({module.variant})"
            visible = keep[site].expand_as(w)
            assert (w[~visible] == 0).all(), f"{where}: weight on a hidden key"
            sums = w.sum(-1)
            changed = not torch.allclose(getattr(other, OUTPUT_FIELD[site])[layer], w, atol=1e-6)
            if module.variant in POSITION_ONLY:
                assert not changed, f"{where}: position-only weights changed with the tokens"
            else:
                assert changed, f"{where}: weights did not change with the tokens"
            family = FAMILY.get(module.variant)
            if family is None:  # softmax
                continue
            scores = None
            if module.uses_keys:
                with torch.no_grad():
                    q, k = queries_keys(module, seen[(site, layer)])
                    scores = q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)
                soft = masked_softmax(scores, keep[site])
                assert (w - soft).abs().max() > 1e-3, f"{where}: the weights are softmax(q k^T / sqrt(dh))"
            family(w, sums, visible, scores, model.config, where)


def _row_spread(values, where_defined):
    """max - min over the keys where defined, per row [B, H, T]."""
    hi = values.masked_fill(~where_defined, float("-inf")).amax(-1)
    lo = values.masked_fill(~where_defined, float("inf")).amin(-1)
    return hi - lo


def _exact_zeros_or_negatives(w, sums, visible, scores, config, where):
    """ReLU family: unnormalised rows; relu gives exact zeros on visible keys, gelu and leaky relu negatives."""
    assert not torch.allclose(sums, torch.ones_like(sums), atol=1e-3), f"{where}: rows sum to 1"
    if getattr(config, "rela_activation", "relu") == "relu" or "reluformer" in where:
        assert (w[visible] == 0).any(), f"{where}: no exact zero on a visible key"
        assert (w >= 0).all(), f"{where}: negative weight after a relu"
    else:
        assert (w < 0).any(), f"{where}: no negative weight"


def _sparse_simplex(w, sums, visible, scores, config, where):
    """sparsemax / 1.5-entmax: on the simplex, and a threshold function of the scores s on its support: p = s - tau
    (sparsemax), sqrt(p) = s / 2 - tau (1.5-entmax), where softmax has log p = s - log Z. (The tiny models' scores
    are too close together for exact zeros on visible keys, so the form is checked, not the sparsity.)"""
    torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
    support = visible & (w > 0)
    tau = w - scores if "sparsemax" in where else w.sqrt() - scores / 2
    assert (_row_spread(tau, support) < 1e-5).all(), f"{where}: not a thresholded function of the scores"
    assert (_row_spread(w.clamp(min=1e-30).log() - scores, support) > 1e-4).any(), f"{where}: log p = s - log Z"


def _calibrated(w, sums, visible, scores, config, where):
    """a + lambda a_c, r a + (1 - r) a_c and g a + (1 - g) a_c all put more than mass 1 on a row: exp(1 - m) > 1."""
    assert (sums > 1 + 1e-4).all(), f"{where}: a row sums to 1 or less"


def _mixture(w, sums, visible, scores, config, where):
    """GMM: a density over source positions; the strict normalisation sums to 1, the others only about 1."""
    assert (w >= 0).all(), f"{where}: negative weight"
    if config.gmm_normalization == "strict":
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


def _positional(w, sums, visible, scores, config, where):
    """RAN, Synthesizer: softmax of learned logits (rows sum to 1); hard-coded Gaussian: unnormalised densities."""
    if "hard-gaussian" in where and not config.hard_gaussian_normalize:
        assert not torch.allclose(sums, torch.ones_like(sums), atol=1e-3), f"{where}: rows sum to 1"
    else:
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)


FAMILY = {
    "rela": _exact_zeros_or_negatives,
    "reluformer": _exact_zeros_or_negatives,
    "sparsemax": _sparse_simplex,
    "entmax15": _sparse_simplex,
    "calibrated": _calibrated,
    "gmm": _mixture,
    "recurrent": _positional,
    "synthesizer": _positional,
    "hard-gaussian": _positional,
}
