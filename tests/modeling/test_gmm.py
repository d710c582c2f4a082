"""Gaussian-mixture cross-attention (Zhang & Feng 2021): normalisation, numerics, padding,
parameter overhead, the synthesis network's decoding state, and the gate / mixture analysis (Figure 5).

The generic preset contract runs for every gmm preset in tests/test_presets.py (training step, beam search, cache
agreement, remote-code load) and tests/contract/ (the returned weights are Eq. 13's); this file checks what is
specific to GMM.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import EOS, PAD, tiny_batch, tiny_config, tiny_model

import hf_attn
from hf_attn.analysis import gmm as gmm_analysis
from hf_attn.modeling.cache import CACHE_KWARG
from hf_attn.modeling.masking import KeepMask

GMM_PRESETS = sorted(name for name in hf_attn.PRESETS if name.startswith("gmm"))
NORMALIZATIONS = ("approximate", "strict", "synthesis")


def cross(model, layer=0):
    return model.model.decoder.layers[layer].encoder_attn


def real_rows(weights, labels):
    """Sums over the source of the rows of real target tokens: [n]."""
    sums = weights.sum(-1)  # [B, H, T]
    return sums[labels.ne(-100)[:, None, :].expand_as(sums)]


def module_inputs(d_model, batch=2, tgt=5, src=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tgt, d_model, generator=g), torch.randn(batch, src, d_model, generator=g)


def run_module(module, hidden, memory, keep_src):
    """One cross-attention call with a bool source keep mask [B, S] -> (output [B,T,d], weights [B,H,T,S])."""
    keep = keep_src[:, None, None, :].expand(-1, 1, hidden.shape[1], -1)
    with torch.no_grad():
        return module(hidden, key_value_states=memory, attention_mask=keep, output_attentions=True)


# ---- normalisation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ("marian", "bart"))
def test_fused_weights_sum_to_about_one_for_gmm_and_exactly_one_for_strict(base):
    b = tiny_batch()
    for preset, tol in (("gmm", 0.1), ("gmm-strict", 1e-5)):
        out = tiny_model(base, preset)(**b, output_attentions=True)
        assert len(out.cross_attentions) == 2
        for w in out.cross_attentions:
            sums = real_rows(w, b["labels"])
            assert torch.isfinite(w).all() and (w >= 0).all()
            torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=tol)
            if preset == "gmm":  # a normalised Gaussian at integer positions with sigma >= 0.5 overshoots <~1.5%
                assert sums.max() < 1.02


def test_approximate_normalisation_keeps_the_mixture_mass_near_one():
    """Eq. 12 keeps 3 sigma inside the sentence: with centres away from the edges beta sums to ~1 (Eq. 6)."""
    module = cross(tiny_model("marian", "gmm"))
    g = torch.Generator().manual_seed(0)
    shape = (3, 4, 50, 1)
    raw = {
        "weight": torch.randn(*shape[:-1], 4, generator=g),
        "mean": torch.empty(*shape[:-1], 4).uniform_(-1.1, 1.1, generator=g),  # mu in [0.25 J, 0.75 J]
        "sigma": 3 * torch.randn(*shape[:-1], 4, generator=g),
    }
    out = torch.cat([raw.get(name, torch.zeros(*shape)) for name in module.gmm_ffns], dim=-1)  # + a gate column
    beta, _, params = module.mixture_attention(out, module.source_geometry(KeepMask(1, 24), None), None)
    sums = beta.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=0.03)
    torch.testing.assert_close(params["weights"].sum(-1), torch.ones(shape[:-1]))  # Eq. 10
    assert (params["sigma"] <= params["mu"] / 3 + 1e-5).logical_or(params["sigma"] == module.sigma_min).all()
    assert (params["sigma"] <= 24 / 6 + 1e-5).all()


@pytest.mark.parametrize("grad", [True, False], ids=["train", "decode"])
def test_concentrated_components_match_eq_6_far_from_their_centres(grad):
    """Trained components are narrow: at most source positions their log density lies far below -87, where exp
    underflows. beta still equals Eq. 6 in float64 (the floor on the log density changes it by < 1e-25)."""
    module = cross(tiny_model("marian", "gmm"))
    j_len, k = 200, module.num_components
    mean = torch.tensor([-4.0, -1.0, 1.0, 4.0]).expand(2, 4, 3, k)  # centres spread over the sentence
    sigma = torch.full((2, 4, 3, k), -8.0)  # sigma -> sigma_min = 0.5
    weight = torch.randn(2, 4, 3, k, generator=torch.Generator().manual_seed(0))
    out = torch.cat([weight, mean, sigma, torch.zeros(2, 4, 3, 1)], dim=-1)
    with torch.set_grad_enabled(grad):
        beta, _, params = module.mixture_attention(out, module.source_geometry(KeepMask(1, j_len), None), None)
    w, mu, sd = params["weights"].double(), params["mu"].double(), params["sigma"].double()
    assert torch.allclose(sd, torch.full_like(sd, module.sigma_min))
    j = torch.arange(j_len, dtype=torch.float64)
    sd = sd[..., None]
    density = torch.exp(-((j - mu[..., None]) ** 2) / (2 * sd**2)) / torch.sqrt(2 * math.pi * sd**2)
    want = (w[..., None] * density).sum(-2)  # Eq. 6
    assert (want < 1e-30).float().mean() > 0.7  # most positions are far from every centre
    torch.testing.assert_close(beta.double(), want, rtol=1e-5, atol=1e-25)


@pytest.mark.parametrize("c", (4.5, 1.0), ids=("approximate", "synthesis"))
def test_mixture_density_gradient_equals_autograd_through_eq_6(c):
    """`MixtureDensity` writes out the gradient of Eq. 6; it equals autograd's through the same sum without the
    floor (both in float64), to 1e-7: for wide and narrow components (most positions below the floor), a component of
    width 0 (r = 0) and every position of a component under the floor (a tiny weight)."""
    from hf_attn.modeling.gmm_mixture import MixtureDensity

    g = torch.Generator().manual_seed(0)
    shape, j_len = (2, 3, 4, 4), 60
    log_coef = torch.randn(shape, generator=g)
    log_coef[0, 0, 0, 1] = -200.0  # the whole component under the floor
    mu = torch.rand(shape, generator=g) * j_len
    r = torch.rand(shape, generator=g) * 1.5  # up to 1 / (3 * sigma_min): narrow
    r[1, 2, 3, 0] = 0.0
    pos = torch.arange(j_len, dtype=torch.float32).expand(2, 1, 1, j_len)
    scale = torch.rand(2, 1, 1, j_len, generator=g)
    incoming = torch.randn(*shape[:-1], j_len, generator=g)

    leaves = [x.double().requires_grad_() for x in (log_coef, mu, r)]
    beta = MixtureDensity.apply(*leaves, c, pos.double(), scale.double())
    beta.backward(incoming.double())
    want_leaves = [x.double().requires_grad_() for x in (log_coef, mu, r)]
    a, m, rr = want_leaves
    z = (pos.double()[..., None, :] - m[..., None]) * rr[..., None]
    want = (a[..., None] - c * z**2).exp().sum(-2) * scale.double()  # Eq. 6 (scale: Z's constant, 0 on padding)
    want.backward(incoming.double())
    torch.testing.assert_close(beta, want, rtol=1e-7, atol=1e-20)
    for got, ref in zip(leaves, want_leaves):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-7, atol=1e-20)
    assert ((a[..., None] - c * z**2) < -60).float().mean() > 0.3  # the floor holds at many positions


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_fused_weights_equal_the_equations_written_out(normalization):
    """One cross-attention call against Eq. 1-2, 6 and 10-15 (and the Table 1 variants) written out literally, per
    head, query, component and source position, from the module's own parameters."""
    model = tiny_model("marian", "gmm", gmm_normalization=normalization)
    module = cross(model)
    hidden, memory = module_inputs(model.config.d_model, batch=2, tgt=3, src=6, seed=1)
    real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    out, gamma = run_module(module, hidden, memory, real)
    b, t, h, dh = 2, 3, module.num_heads, module.head_dim
    with torch.no_grad():
        q = module.q_proj(hidden).view(b, t, h, dh).transpose(1, 2)
        k = module.k_proj(memory).view(b, 6, h, dh).transpose(1, 2)
        v = module.v_proj(memory).view(b, 6, h, dh).transpose(1, 2)

        def ffn(name, x):  # Eq. 7-9, 14
            f = getattr(module, f"gmm_{name}")
            return f.out(torch.tanh(f.hidden(x)))

        want = torch.zeros(b, h, t, 6)
        for i in range(b):
            n = int(real[i].sum())
            alpha = torch.softmax(q[i] @ k[i, :, :n].transpose(-1, -2) / math.sqrt(dh), -1)  # Eq. 1-2
            raw_w, raw_mu, raw_sigma = ffn("weight", q[i]), ffn("mean", q[i]), ffn("sigma", q[i])
            if normalization == "synthesis":  # Graves 2013: w = exp(.), mu_i = mu_{i-1} + exp(.), 1/(2 s^2) = exp(.)
                w, mu = raw_w.exp(), raw_mu.exp().cumsum(1)
                sigma = torch.sqrt(torch.exp(-raw_sigma) / 2).clamp(min=module.sigma_min)
            else:
                w, mu = torch.softmax(raw_w, -1), n * torch.sigmoid(raw_mu)  # Eq. 10-11
                sigma = n * torch.sigmoid(raw_sigma)  # strict
                if normalization == "approximate":  # Eq. 12
                    sigma = torch.minimum(n / 6 * torch.sigmoid(raw_sigma), torch.minimum(mu, n - mu) / 3)
                sigma = sigma.clamp(min=module.sigma_min)
            j = torch.arange(n, dtype=torch.float32)
            density = torch.exp(-(j - mu[..., None]) ** 2 / (2 * sigma[..., None] ** 2))
            if normalization != "synthesis":
                density = density / torch.sqrt(2 * math.pi * sigma[..., None] ** 2)
            beta = (w[..., None] * density).sum(-2)  # Eq. 6
            if normalization == "strict":
                beta = beta / beta.sum(-1, keepdim=True)
            g = torch.sigmoid(ffn("gate", q[i]))  # Eq. 14
            want[i, :, :, :n] = (1 - g) * alpha + g * beta  # Eq. 13
        torch.testing.assert_close(gamma, want, rtol=1e-4, atol=1e-6)
        context = (want @ v).transpose(1, 2).reshape(b, t, h * dh)  # Eq. 15
        torch.testing.assert_close(out, module.out_proj(context), rtol=1e-4, atol=1e-5)


# ---- numerics ----------------------------------------------------------------------------------------------------
def check_finite(model, batch):
    out = model(**batch, output_attentions=True)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    for w in out.cross_attentions:
        assert torch.isfinite(w).all()
    out.loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
    model.zero_grad()


def one_token_batch():
    """Sources of a single token (EOS alone) and a single word + EOS; right padding."""
    src = torch.tensor([[EOS, PAD, PAD], [7, EOS, PAD]])
    return {"input_ids": src, "attention_mask": src.ne(PAD).long(), "labels": torch.tensor([[5, 6, EOS], [9, EOS, -100]])}


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_one_token_and_padded_sources_are_finite(normalization):
    model = tiny_model("marian", "gmm", gmm_normalization=normalization).train()
    check_finite(model, one_token_batch())
    check_finite(model, tiny_batch())  # padded sources of length 9, 6 and 2


@pytest.mark.parametrize("normalization", NORMALIZATIONS)
@pytest.mark.parametrize("edge", (-1e4, 1e4))
def test_centres_and_widths_at_the_edges_are_finite(normalization, edge):
    """mu = 0 or J exactly (sigmoid saturated; synthesis: no step or the largest step), and extreme sigma_hat."""
    model = tiny_model("marian", "gmm", gmm_normalization=normalization).train()
    with torch.no_grad():
        for m in gmm_analysis.gmm_modules(model).values():
            m.gmm_mean.out.bias.fill_(edge)
            m.gmm_sigma.out.bias.fill_(-edge)
            m.gmm_weight.out.bias.fill_(edge)
    for batch in (tiny_batch(), one_token_batch()):
        check_finite(model, batch)
    records = gmm_analysis.gmm_parameters(model, **tiny_batch())
    for rec in records.values():
        assert (rec["sigma"] >= model.config.gmm_sigma_min - 1e-6).all()
        if normalization != "synthesis":
            expected = 0.0 if edge < 0 else 1.0
            torch.testing.assert_close(rec["mu"] / rec["source_length"][:, None, None, None], torch.full_like(rec["mu"], expected))


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("preset", ("gmm", "gmm-strict", "gmm-synthesis", "gmm-only"))
def test_autocast_is_finite_and_close_to_float32(preset, dtype):
    model = tiny_model("marian", preset)
    batch = tiny_batch()
    with torch.no_grad():
        ref = model(**batch, output_attentions=True)
    with torch.autocast("cpu", dtype=dtype):
        out = model(**batch, output_attentions=True)
        out.loss.backward()
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient under {dtype}"
    for w, w_ref in zip(out.cross_attentions, ref.cross_attentions):
        assert torch.isfinite(w).all()
        # the mixture itself runs in float32: only the projections' rounding differs
        torch.testing.assert_close(w.float(), w_ref, rtol=0, atol=0.1)


# ---- parameters ------------------------------------------------------------------------------------------------
def ffn_params(dh, n_out):
    return dh * dh + dh + dh * n_out + n_out  # W, b1, V, b2 (Eq. 7-9, 14)


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("gmm", lambda dh, k: 3 * ffn_params(dh, k) + ffn_params(dh, 1)),
        ("gmm-strict", lambda dh, k: 3 * ffn_params(dh, k) + ffn_params(dh, 1)),
        ("gmm-average", lambda dh, k: 3 * ffn_params(dh, k)),
        ("gmm-share-mean", lambda dh, k: 2 * ffn_params(dh, k) + 2 * ffn_params(dh, 1)),
        ("gmm-share-weight", lambda dh, k: 2 * ffn_params(dh, k) + ffn_params(dh, 1)),  # weights are all 1/K: no FFN
    ],
)
def test_parameter_overhead_per_layer(preset, expected):
    """About +17.5k parameters per layer at dh = 64, K = 4 (paper: +0.1M for 6 layers)."""
    size = dict(d_model=256, encoder_attention_heads=4, decoder_attention_heads=4, max_position_embeddings=16)
    n = {p: sum(t.numel() for t in tiny_model("marian", p, **size).parameters()) for p in ("softmax", preset)}
    per_layer = (n[preset] - n["softmax"]) / 2
    assert per_layer == expected(64, 4)
    if preset == "gmm":
        assert per_layer == 17485  # 4 dh^2 + (3K + 5) dh + 3K + 1


def test_layer_subsets_put_gmm_where_table_5_says():
    def layers(preset, n):
        return sorted(gmm_analysis.gmm_modules(tiny_model("marian", preset, decoder_layers=n)))

    assert layers("gmm", 6) == [0, 1, 2, 3, 4, 5]
    assert layers("gmm-bottom2", 6) == [0, 1] and layers("gmm-middle2", 6) == [2, 3] and layers("gmm-top2", 6) == [4, 5]
    assert layers("gmm-middle2", 3) == [0, 1]
    model = tiny_model("marian", "gmm", decoder_layers=3, cross_attention_layers=[1])
    assert sorted(gmm_analysis.gmm_modules(model)) == [1]
    with pytest.raises(hf_attn.HfAttnConfigError, match="gmm_layer_subset"):
        tiny_config("marian", "gmm-top2", decoder_layers=1)
    with pytest.raises(hf_attn.HfAttnConfigError, match="cross_attention_layers"):
        tiny_config("marian", "gmm-top2", decoder_layers=4, cross_attention_layers=[0])


@pytest.mark.parametrize(
    "field,value",
    [("gmm_sigma_min", 0), ("gmm_sigma_min", float("nan")), ("gmm_num_components", 0), ("gmm_normalization", "exact"),
     ("gmm_fusion", "sum"), ("gmm_share_mean", "yes")],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(hf_attn.HfAttnConfigError, match=field):
        tiny_config("marian", "gmm", **{field: value})


# ---- padding -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("normalization", NORMALIZATIONS)
def test_positions_count_from_the_first_real_token(normalization):
    """Right padding, left padding and no padding give the same attention over the real tokens."""
    model = tiny_model("marian", "gmm", gmm_normalization=normalization)
    module = cross(model)
    hidden, memory = module_inputs(model.config.d_model, batch=1, src=5)
    pad = torch.randn(1, 3, model.config.d_model)
    alone_out, alone_w = run_module(module, hidden, memory, torch.ones(1, 5, dtype=torch.bool))
    right = torch.tensor([[True] * 5 + [False] * 3])
    right_out, right_w = run_module(module, hidden, torch.cat([memory, pad], 1), right)
    left_out, left_w = run_module(module, hidden, torch.cat([pad, memory], 1), right.flip(-1))
    for out, w, real in ((right_out, right_w, slice(0, 5)), (left_out, left_w, slice(3, 8))):
        torch.testing.assert_close(out, alone_out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w[..., real], alone_w, rtol=1e-5, atol=1e-6)
        pad_cols = torch.ones(w.shape[-1], dtype=torch.bool)
        pad_cols[real] = False
        assert (w[..., pad_cols] == 0).all()  # nothing on padding


def test_left_padded_batch_matches_right_padded_batch_in_the_model():
    """Through the whole model (encoder outputs handed over unchanged): only the source layout differs."""
    model = tiny_model("marian", "gmm")
    b = tiny_batch()
    enc = model.get_encoder()(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    ref = model(encoder_outputs=enc, attention_mask=b["attention_mask"], labels=b["labels"])
    # move each sentence's padding to the front
    lengths = b["attention_mask"].sum(-1)
    S = b["attention_mask"].shape[1]
    index = torch.stack([(torch.arange(S) - (S - n)) % S for n in lengths.tolist()])
    hidden = torch.gather(enc.last_hidden_state, 1, index[..., None].expand_as(enc.last_hidden_state))
    mask = torch.gather(b["attention_mask"], 1, index)
    assert mask[:, 0].eq(0).any() and mask[:, -1].eq(1).all()
    enc.last_hidden_state = hidden
    left = model(encoder_outputs=enc, attention_mask=mask, labels=b["labels"])
    torch.testing.assert_close(left.logits, ref.logits, rtol=1e-5, atol=1e-5)


# ---- the synthesis network's state ------------------------------------------------------------------------------
def sharp_synthesis_model(base):
    """A tiny gmm-synthesis model whose output depends strongly on where its (recurrent) centres are: gate ~ 1,
    sigma = sigma_min, token-dependent steps, a loud cross-attention. A random tiny model hardly reads the source,
    so a wrong decoding state would go unnoticed there."""
    model = tiny_model(base, "gmm-synthesis", seed=3)
    with torch.no_grad():
        for m in gmm_analysis.gmm_modules(model).values():
            m.gmm_gate.out.bias.fill_(10.0)
            m.gmm_sigma.out.bias.fill_(10.0)
            m.gmm_mean.out.weight.mul_(3.0)
            m.gmm_mean.out.bias.fill_(-1.0)
            m.out_proj.weight.mul_(30.0)
    return model


BEAM_KW = dict(do_sample=False, max_new_tokens=7, min_new_tokens=7, output_scores=True, return_dict_in_generate=True)


@pytest.mark.parametrize("base", ("marian", "bart"))
def test_synthesis_state_follows_cache_and_beams(base):
    model = sharp_synthesis_model(base)
    b = tiny_batch()
    src = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    for beams in (1, 4):
        cached = model.generate(**src, num_beams=beams, use_cache=True, **BEAM_KW)
        uncached = model.generate(**src, num_beams=beams, use_cache=False, **BEAM_KW)
        assert torch.equal(cached.sequences, uncached.sequences), beams
        for s_c, s_u in zip(cached.scores, uncached.scores):
            torch.testing.assert_close(s_c, s_u, rtol=1e-4, atol=1e-4)
        if beams > 1:
            torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=1e-5, atol=1e-5)


def test_synthesis_state_lives_in_the_cache_and_is_reordered_cropped_and_reset():
    from transformers.cache_utils import DynamicCache

    from hf_attn.modeling.cache import HfAttnCache

    cache = HfAttnCache(DynamicCache(), DynamicCache())
    cache.set_state("gmm_synthesis_mu.0", torch.arange(4.0).view(4, 1, 1, 1).expand(4, 4, 3, 4).clone(), target_dim=2)
    cache.set_state("calibration_keys.0", torch.arange(4.0).view(4, 1, 1, 1).expand(4, 4, 5, 2).clone())
    cache.reorder_cache(torch.tensor([2, 2, 0, 3]))
    assert cache.get_state("gmm_synthesis_mu.0")[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 3.0]
    assert cache.get_state("calibration_keys.0")[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0, 3.0]
    cache.crop(-1)  # one target position less; source-side state untouched
    assert cache.get_state("gmm_synthesis_mu.0").shape[2] == 2 and cache.get_state("calibration_keys.0").shape[2] == 5
    cache.batch_select_indices(torch.tensor([1, 3]))
    assert cache.get_state("gmm_synthesis_mu.0")[:, 0, 0, 0].tolist() == [2.0, 3.0]
    cache.reset()
    assert cache.get_state("gmm_synthesis_mu.0") is None
    # generation keeps the state in the cache it returns, one centre history per hypothesis and position
    model = tiny_model("marian", "gmm-synthesis")
    b = tiny_batch(batch=2)
    out = model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], max_new_tokens=3,
                         min_new_tokens=3, num_beams=1, return_dict_in_generate=True, use_cache=True)
    assert isinstance(getattr(out, CACHE_KWARG), HfAttnCache)
    mu = getattr(out, CACHE_KWARG).get_state("gmm_synthesis_mu.0")
    assert mu.shape[0] == 2 and mu.shape[2] == getattr(out, CACHE_KWARG).get_seq_length()


@pytest.mark.parametrize("base", ("marian", "bart"))
def test_synthesis_without_reordering_would_differ(base, monkeypatch):
    """Guards the test above: its beam search really depends on the reordered state (else it tests nothing)."""
    model = sharp_synthesis_model(base)
    b = tiny_batch()
    src = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=4, use_cache=True)
    good = model.generate(**src, **BEAM_KW)
    from transformers.cache_utils import EncoderDecoderCache

    from hf_attn.modeling.cache import HfAttnCache

    monkeypatch.setattr(HfAttnCache, "reorder_cache", EncoderDecoderCache.reorder_cache)  # keys/values only
    bad = model.generate(**src, **BEAM_KW)
    same = torch.equal(good.sequences, bad.sequences)
    assert not (same and torch.allclose(good.sequences_scores, bad.sequences_scores, rtol=1e-5, atol=1e-5))


# ---- analysis: gates and mixture parameters, Figure 5 -------------------------------------------------------------
def test_gate_values_and_mixture_parameters_per_layer(tmp_path):
    model = tiny_model("bart", "gmm-top2", decoder_layers=4)
    b = tiny_batch()
    records = gmm_analysis.gmm_parameters(model, **b)
    assert sorted(records) == [2, 3]  # only the GMM layers
    B, T = b["labels"].shape
    H, K, S = model.config.decoder_attention_heads, model.config.gmm_num_components, b["input_ids"].shape[1]
    with torch.no_grad():
        fused = model(**b, output_attentions=True).cross_attentions
    for layer, rec in records.items():
        assert rec["gate"].shape == (B, H, T) and ((rec["gate"] > 0) & (rec["gate"] < 1)).all()
        for name in ("weights", "mu", "sigma"):
            assert rec[name].shape == (B, H, T, K), name
        for name in ("alpha", "beta", "gamma"):
            assert rec[name].shape == (B, H, T, S), name
        assert rec["source_length"].tolist() == b["attention_mask"].sum(-1).tolist()  # J
        assert (rec["mu"] <= rec["source_length"][:, None, None, None]).all()
        g = rec["gate"][..., None]
        torch.testing.assert_close(rec["gamma"], (1 - g) * rec["alpha"] + g * rec["beta"])  # Eq. 13
        torch.testing.assert_close(rec["gamma"], fused[layer].float())
    assert model(**b).attention_details is None  # details only when asked for

    values = gmm_analysis.gate_values(model, [b, tiny_batch(seed=2)])
    n_real = int(b["labels"].ne(-100).sum()) + int(tiny_batch(seed=2)["labels"].ne(-100).sum())
    assert sorted(values) == [2, 3] and all(v.numel() == H * n_real for v in values.values())
    means = gmm_analysis.mean_gate_per_layer(values)
    assert all(0 < m < 1 for m in means.values())
    for freq, edges in gmm_analysis.gate_histograms(values, bins=10).values():
        assert freq.shape == (10,) and edges.shape == (11,) and math.isclose(freq.sum().item(), 1.0, rel_tol=1e-5)

    pytest.importorskip("matplotlib")
    path = gmm_analysis.plot_gate_distribution(values, tmp_path / "fig5.png")
    assert path.exists() and path.stat().st_size > 1000


def test_analysis_errors_are_clear():
    with pytest.raises(ValueError, match="no Gaussian-mixture"):
        gmm_analysis.gmm_parameters(tiny_model("marian", "softmax"), **tiny_batch())
    with pytest.raises(ValueError, match="gmm_fusion='gate'"):
        gmm_analysis.gate_values(tiny_model("marian", "gmm-average"), [tiny_batch()])
    with pytest.raises(ValueError, match="labels or decoder_input_ids"):
        gmm_analysis.gmm_parameters(tiny_model("marian", "gmm"), input_ids=tiny_batch()["input_ids"])


# ---- decoding: step-independent parts are computed once ------------------------------------------------------------
def test_source_geometry_is_kept_in_the_decoding_state():
    """j and J (Eq. 11) depend on the source only: set at the first cached step, read (not recomputed) later."""
    from transformers.cache_utils import DynamicCache

    from hf_attn.modeling.cache import HfAttnCache
    from hf_attn.modeling.forward_state import AttentionContext

    module = cross(tiny_model("marian", "gmm"))
    cache = HfAttnCache(DynamicCache(), DynamicCache())
    real = KeepMask(1, 4, torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool))

    def geometry(past, mask):
        ctx = AttentionContext(torch.zeros(2, 1, 32), torch.zeros(2, 4, 32), past, cache, False, None)
        return module.source_geometry(mask, ctx)

    first = geometry(0, real)
    assert first.length.flatten().tolist() == [3.0, 3.0] and first.pos[1, 0, 0].tolist() == [-1.0, 0.0, 1.0, 2.0]
    assert first.bias[0, 0, 0, 3] == torch.finfo(torch.float32).min and first.bias[0, 0, 0, :3].eq(0).all()
    assert cache.get_state("gmm_source_geometry").shape == (2, 1, 6, 1, 4)
    later = geometry(1, KeepMask(1, 4))  # a later step reads the state of the first one
    assert all(torch.equal(a, b) for a, b in zip(later, first))
    assert geometry(0, KeepMask(1, 4)).length.flatten().tolist() == [4.0, 4.0]  # a new decode starts afresh


def test_ffn_weights_are_kept_without_autograd_until_a_parameter_changes():
    module = cross(tiny_model("marian", "gmm"))
    q = torch.randn(2, 4, 1, module.head_dim)
    with torch.no_grad():
        first = module.ffn_weights()
        assert module.ffn_weights() is first
        before = module.ffn_outputs(q)["gate"]
        module.gmm_gate.out.bias.add_(1.0)  # an optimiser step changes a parameter in place
        assert module.ffn_weights() is not first
        torch.testing.assert_close(module.ffn_outputs(q)["gate"], before + 1.0)
    assert module.ffn_weights()[0].requires_grad  # with autograd: built from the live parameters


def test_ffn_outputs_equal_the_tanh_network_of_eq_7_9():
    """The FFNs run with tanh(a) = 2 sigmoid(2a) - 1 folded into their weights: with and without autograd, the
    outputs are V tanh(W x + b1) + b2 (Eq. 7-9, 14) of each FFN's own parameters, and gradients reach them."""
    module = cross(tiny_model("marian", "gmm"))
    q = torch.randn(3, 4, 5, module.head_dim) * 4  # hidden pre-activations across tanh's whole range
    want = {name: getattr(module, f"gmm_{name}") for name in module.gmm_ffns}
    want = {name: ffn.out(torch.tanh(ffn.hidden(q))).detach() for name, ffn in want.items()}
    with_grad = module.ffn_outputs(q)
    with torch.no_grad():
        without = module.ffn_outputs(q)
    assert set(with_grad) == set(without) == {"weight", "mean", "sigma", "gate"}
    for name, out in want.items():
        torch.testing.assert_close(with_grad[name].detach(), out, atol=2e-6, rtol=0)
        torch.testing.assert_close(without[name], out, atol=2e-6, rtol=0)
    sum(out.sum() for out in with_grad.values()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.gmm_gate.parameters())


def test_ffn_outputs_compile_into_one_graph_without_autograd():
    """Decoding (no autograd) keeps the FFN weights keyed on the parameters' storage; under torch.compile the graph
    builds them instead: reading storage pointers on the host would break the graph at every decoding step."""
    module = cross(tiny_model("marian", "gmm"))
    q = torch.randn(2, 4, 1, module.head_dim)
    compiled = torch.compile(module.ffn_outputs, fullgraph=True, backend="eager")
    with torch.no_grad():
        want = module.ffn_outputs(q)  # an eager step first: the cache holds weights and their key
        got = compiled(q)
    for name, out in want.items():
        torch.testing.assert_close(got[name], out)
