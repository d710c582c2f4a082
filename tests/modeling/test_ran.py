"""RAN (recurrent attention) and the position-only baselines hard-gaussian and synthesizer.

The generic preset contract is in tests/test_presets.py (training, beam, cache == no cache, fresh-process Hub load) and
tests/contract/ (the returned weights are the variant's equation); here: one owner per parameter, the eval-mode matrix cache (used, invalidated), the equations,
padding, length limits, position-embedding removal, and the analysis helpers.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import EOS, tiny_batch, tiny_config, tiny_model
from safetensors import safe_open

import hf_attn
from hf_attn import HfAttnConfigError

SMALL = dict(ran_max_positions=32, ran_transition_dim=48)  # fast tiny RAN models


def ran_model(base="marian", preset="ran-all", **kw):
    """A tiny model of ``preset``; SMALL's RAN sizes only where it runs RAN (the position-only baselines refuse them)."""
    uses_ran = "recurrent" in {v for k, v in hf_attn.PRESETS[preset].overrides.items() if k.endswith("_attention")}
    return tiny_model(base, preset, **{**(SMALL if uses_ran else {}), **kw})


def count_transition_calls(model):
    counts = {}
    for site in ("encoder", "decoder"):
        stack = getattr(getattr(model.model, site), "ran_stack", None)
        if stack is not None:
            counts[site] = 0

            def hook(*_, site=site):
                counts[site] += 1

            stack.transition.register_forward_hook(hook)
    return counts


def src_of(b):
    return dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"])


# ---------------------------------------------------------------------------------------------------------------
# Ownership and save / load
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_each_stack_owns_its_matrices_once(base):
    model = ran_model(base, "ran-all")
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names))
    a0 = [n for n in names if n.endswith("initial_attention")]
    assert a0 == ["model.encoder.ran_stack.initial_attention", "model.decoder.ran_stack.initial_attention"]
    assert sum(n.endswith("transition.fc1.weight") for n in names) == 2
    for site in ("encoder", "decoder"):
        stack = getattr(model.model, site).ran_stack
        for step, m in enumerate(model.attention_modules(site)):
            assert m.ran_stack is stack and m.ran_step == step
            assert not hasattr(m, "q_proj") and not hasattr(m, "k_proj")  # value + output projections only
            own = [n for n, _ in m.named_parameters()]
            assert own == ["v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"]
    h, lmax = model.config.encoder_attention_heads, SMALL["ran_max_positions"]
    assert model.model.encoder.ran_stack.initial_attention.shape == (h, lmax, lmax)


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_save_load_roundtrip_with_shared_state(tmp_path, base):
    model = ran_model(base, "ran-all-fixed-init")
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    ran_keys = sorted(k for k in keys if "ran_stack" in k)
    expected = sorted(n for n, _ in model.named_parameters() if "ran_stack" in n)
    assert ran_keys == expected and len(ran_keys) == 10  # A_0 + fc1/fc2 weight/bias, per stack, once each
    cls = type(model)
    loaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    loaded.eval()
    for site in ("encoder", "decoder"):
        stack = getattr(loaded.model, site).ran_stack
        assert all(m.ran_stack is stack for m in loaded.attention_modules(site))  # references rebuilt, not copies
        assert not stack.initial_attention.requires_grad  # frozen A_0 stays frozen after loading
        assert stack.transition.fc1.weight.requires_grad
    b = tiny_batch()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**b).logits, model(**b).logits, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# The matrices: computed once per forward in training, once in total in eval mode
# ---------------------------------------------------------------------------------------------------------------
def test_training_computes_the_matrices_once_per_forward():
    model = ran_model("marian", "ran-all").train()
    counts = count_transition_calls(model)
    layers = model.config.encoder_layers
    model(**tiny_batch())
    assert counts == {"encoder": layers, "decoder": layers}  # one Rec call per layer, shared by the stack
    model(**tiny_batch())
    assert counts == {"encoder": 2 * layers, "decoder": 2 * layers}


def test_eval_cache_used_by_generate_and_invalidated_by_updates():
    model = ran_model("marian", "ran-all")
    counts = count_transition_calls(model)
    layers = model.config.encoder_layers
    src = src_of(tiny_batch())
    first = model.generate(**src, num_beams=4, max_new_tokens=8)
    assert counts == {"encoder": layers, "decoder": layers}  # not once per decoding step
    again = model.generate(**src, num_beams=4, max_new_tokens=8, use_cache=False)
    assert counts == {"encoder": layers, "decoder": layers}  # not even per call
    assert torch.equal(first, again)

    # an optimiser step (model left in eval mode: only the parameter versions change) invalidates the cache
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    model(**tiny_batch()).loss.backward()
    opt.step()
    with torch.no_grad():
        model(**tiny_batch())
    assert counts == {"encoder": 3 * layers, "decoder": 3 * layers}  # the grad-building pass + the new cache
    stack = model.model.decoder.ran_stack
    with torch.no_grad():
        cached = stack.layer_logits(1, 5)[:, :5]
        fresh = stack.recurrence(stack.initial_attention[:, :5])[1]
    torch.testing.assert_close(cached, fresh)

    # an in-place edit of A_0 is seen too
    with torch.no_grad():
        stack.initial_attention[:, 0, 0] += 5.0
        torch.testing.assert_close(stack.layer_logits(0, 1)[:, :1], stack.recurrence(stack.initial_attention[:, :1])[0])

    # eval() again (a loop calling it before each batch) keeps the cache; train() drops it
    model.eval()
    assert stack._eval_mats is not None
    model.train()
    assert stack._eval_mats is None and stack._eval_key is None
    model.eval()
    n = counts["decoder"]
    with torch.no_grad():
        model(**tiny_batch())
    assert counts["decoder"] == n + layers


def test_eval_cache_rows_match_training_rows():
    model = ran_model("bart", "ran-d")
    b = tiny_batch()
    with torch.no_grad():
        eval_logits = model(**b).logits
        model.train()
        for m in model.modules():  # training code path (per-forward rows), without dropout
            if hasattr(m, "ran_dropout"):
                m.ran_dropout = 0.0
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        model.config.dropout = 0.0
        train_logits = model(**b).logits
    torch.testing.assert_close(train_logits, eval_logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Equations
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transition", ["ffn", "tanh_layernorm"])
def test_recurrence_and_layer_attention(transition):
    model = ran_model("marian", "ran-all", ran_transition=transition)
    stack = model.model.encoder.ran_stack
    rec = stack.transition
    a = stack.initial_attention.detach()
    with torch.no_grad():
        expected = []
        for _ in range(model.config.encoder_layers):
            if transition == "ffn":  # released code
                delta = rec.fc2(F.relu(rec.fc1(a)))
            else:  # paper Eq. 3
                delta = F.layer_norm(torch.tanh(rec.linear(a)), (a.shape[-1],), rec.norm.weight, rec.norm.bias)
            a = a + delta  # Eq. 4
            expected.append(a)
        got = stack.matrices()
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)

    b = tiny_batch()
    with torch.no_grad():
        out = model(**b, output_attentions=True)
    n = b["attention_mask"][0].sum().item()  # sentence 0 has no padding
    for layer, w in enumerate(out.encoder_attentions):
        p = torch.softmax(expected[layer][:, :n, :n], dim=-1)
        torch.testing.assert_close(w[0], p, rtol=1e-5, atol=1e-6)
    for w in out.decoder_attentions:  # causal: only the lower triangle
        t = w.shape[-1]
        assert (w[..., ~torch.ones(t, t, dtype=torch.bool).tril()] == 0).all()
        torch.testing.assert_close(w.sum(-1)[0], torch.ones_like(w.sum(-1)[0]))


def test_attention_dropout_default_follows_the_paper():
    model = ran_model("marian", "ran-all")
    assert all(m.ran_dropout == 0.2 for m in model.attention_modules("encoder"))
    model = ran_model("marian", "ran-all", ran_attention_dropout=None, attention_dropout=0.05)
    assert all(m.ran_dropout == 0.05 for m in model.attention_modules("decoder"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_and_one_token_inputs_stay_finite(dtype):
    for preset in ("ran-all", "hard-gaussian", "synthesizer"):
        model = ran_model("marian", preset).train()
        b = {  # one-token source (EOS only) and one-token target, no padding
            "input_ids": torch.full((2, 1), EOS),
            "attention_mask": torch.ones(2, 1, dtype=torch.long),
            "labels": torch.full((2, 1), EOS),
        }
        with torch.autocast("cpu", dtype=dtype):
            out = model(**b)
        assert torch.isfinite(out.loss), (preset, out.loss)
        out.loss.backward()


# ---------------------------------------------------------------------------------------------------------------
# Padding and lengths
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["ran-all", "synthesizer"])
def test_right_padding_is_invisible_and_left_padding_is_refused(preset):
    model = ran_model("bart", preset)
    b = tiny_batch()
    with torch.no_grad():
        batched = model(**b).logits
        for i in range(b["input_ids"].shape[0]):
            n = int(b["attention_mask"][i].sum())
            t = int((b["labels"][i] != -100).sum())
            single = model(input_ids=b["input_ids"][i : i + 1, :n], labels=b["labels"][i : i + 1, :t]).logits
            torch.testing.assert_close(batched[i : i + 1, :t], single, rtol=1e-4, atol=1e-4)
    left = tiny_batch()
    left["input_ids"] = torch.flip(left["input_ids"], dims=[1])
    left["attention_mask"] = torch.flip(left["attention_mask"], dims=[1])
    with pytest.raises(HfAttnConfigError, match="right padding"):
        model(**left)
    dec = ran_model("marian", "ran-d")
    ids = torch.randint(3, 60, (2, 5))
    dmask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # a left-padded target
    with pytest.raises(HfAttnConfigError, match=r"\(decoder\).*right padding"):
        dec(input_ids=ids, decoder_input_ids=ids, decoder_attention_mask=dmask)


def test_too_long_inputs_name_the_limit_and_generation_is_capped():
    model = ran_model("marian", "ran-all", ran_max_positions=12)
    long = tiny_batch(src_len=13, tgt_len=5)
    with pytest.raises(HfAttnConfigError, match=r"ran_max_positions=12.*truncate"):
        model(**long)
    long_tgt = tiny_batch(src_len=6, tgt_len=13)
    with pytest.raises(HfAttnConfigError, match="ran_max_positions=12"):
        model(**long_tgt)
    src = src_of(tiny_batch(src_len=6))
    out = model.generate(**src, max_new_tokens=40, min_new_tokens=40, num_beams=2)
    assert out.shape[1] <= 12
    out = model.generate(**src, max_length=100, min_length=100)
    assert out.shape[1] <= 12
    assert model.max_target_positions() == 12
    assert ran_model("marian", "ran-e", ran_max_positions=12).max_target_positions() is None  # decoder unlimited

    syn = tiny_model("marian", "synthesizer", synthesizer_max_positions=10)
    with pytest.raises(HfAttnConfigError, match="synthesizer_max_positions=10"):
        syn(**tiny_batch(src_len=11))
    assert syn.generate(**src_of(tiny_batch(src_len=6)), max_new_tokens=30, min_new_tokens=30).shape[1] <= 10


def test_bible_lengths_fit_the_defaults():
    config = tiny_config("marian", "ran-all")
    assert config.ran_max_positions >= 128 and config.synthesizer_max_positions >= 128  # max_source_length 128


# ---------------------------------------------------------------------------------------------------------------
# Table 2: without positional embeddings
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_positional_embeddings_can_be_dropped(base):
    model = ran_model(base, "ran-e-no-pos")
    assert type(model.model.encoder.embed_positions).__name__ == "NoPositionalEmbedding"
    assert type(model.model.decoder.embed_positions).__name__ != "NoPositionalEmbedding"
    assert not any("encoder.embed_positions" in n for n, _ in model.named_parameters())
    # without positions, the encoder's only order signal is RAN: a plain softmax encoder would be order-blind
    model = ran_model(base, "ran-d-no-pos")
    assert type(model.model.decoder.embed_positions).__name__ == "NoPositionalEmbedding"
    with pytest.raises(HfAttnConfigError, match="ran_drop_position_embeddings"):
        tiny_config(base, "softmax", ran_drop_position_embeddings="encoder")


def test_config_errors_name_the_field():
    for bad in (
        dict(ran_max_positions=0),
        dict(ran_transition="gru"),
        dict(ran_transition_dim=-1),
        dict(ran_freeze_initial="yes"),
        dict(ran_attention_dropout=1.5),
        dict(ran_drop_position_embeddings="all"),
        dict(hard_gaussian_std=0),
        dict(hard_gaussian_encoder_offsets=[]),
        dict(hard_gaussian_decoder_offsets=[1]),
        dict(hard_gaussian_length_ratio=-1.0),
        dict(synthesizer_max_positions=0),
        dict(synthesizer_init="normal"),
    ):
        key = next(iter(bad))
        with pytest.raises(HfAttnConfigError, match=key):
            tiny_config("marian", "ran-all", **bad)
    with pytest.raises(HfAttnConfigError, match="cross"):
        tiny_config("marian", "softmax", cross_attention="recurrent")


# ---------------------------------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------------------------------
def _gauss(j, c, std=1.0):
    return math.exp(-((j - c) ** 2) / (2 * std**2)) / (std * math.sqrt(2 * math.pi))


def test_hard_gaussian_weights():
    model = tiny_model("marian", "hard-gaussian")
    assert not any(n.endswith(("q_proj.weight", "k_proj.weight")) for n, _ in model.model.encoder.named_parameters())
    b = tiny_batch()
    with torch.no_grad():
        out = model(**b, output_attentions=True)
    enc = out.encoder_attentions[0][0]  # sentence 0: 9 real tokens
    s = enc.shape[-1]
    for i in range(s):
        for j in range(s):
            assert enc[0, i, j].item() == pytest.approx(_gauss(j, i - 1), abs=1e-6)  # head 0: i - 1
            assert enc[1, i, j].item() == pytest.approx(_gauss(j, i + 1), abs=1e-6)  # head 1: i + 1
    torch.testing.assert_close(enc[2], enc[0])  # heads alternate over the offsets
    dec = out.decoder_attentions[0][0]
    t = dec.shape[-1]
    for i in range(t):
        for j in range(t):
            want0 = _gauss(j, i - 1) if j <= i else 0.0
            want1 = _gauss(j, i) if j <= i else 0.0
            assert dec[0, i, j].item() == pytest.approx(want0, abs=1e-6)
            assert dec[1, i, j].item() == pytest.approx(want1, abs=1e-6)
    padded = out.encoder_attentions[0][2]  # sentence 2: 2 real tokens
    assert (padded[..., 2:] == 0).all()


def test_hard_gaussian_cross_attention_is_proportionally_aligned():
    model = tiny_model("bart", "hard-gaussian-cross", hard_gaussian_length_ratio=2.0)
    b = tiny_batch()
    with torch.no_grad():
        w = model(**b, output_attentions=True).cross_attentions[0]  # [B, H, T, S]
    for sent, real in ((0, 9), (1, 6)):  # real source tokens per sentence
        for i in range(w.shape[2]):
            centre = min(2 * i, real - 1)  # c(i) = i * r, clamped to the real source
            assert int(torch.argmax(w[sent, 0, i])) == centre
            assert w[sent, 0, i, centre].item() == pytest.approx(_gauss(0, 0), abs=1e-6)
        assert (w[sent, :, :, real:] == 0).all()
    norm = tiny_model("bart", "hard-gaussian-cross", hard_gaussian_normalize=True)
    with torch.no_grad():
        w = norm(**b, output_attentions=True).cross_attentions[0]
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))


def test_synthesizer_has_one_matrix_per_layer():
    model = tiny_model("marian", "synthesizer", synthesizer_max_positions=16)
    mats = [n for n, _ in model.named_parameters() if n.endswith("synthesizer_logits")]
    assert len(mats) == model.config.encoder_layers + model.config.decoder_layers
    ones = tiny_model("marian", "synthesizer", synthesizer_max_positions=16, synthesizer_init="ones")
    assert (ones.model.decoder.layers[0].self_attn.synthesizer_logits == 1).all()


# ---------------------------------------------------------------------------------------------------------------
# Analysis (Figure 6)
# ---------------------------------------------------------------------------------------------------------------
def test_learned_matrices_and_heatmaps(tmp_path):
    from hf_attn.analysis.ran import attention_entropy, learned_attention, plot_attention_heatmaps

    model = ran_model("marian", "ran-all")
    mats = learned_attention(model, length=10)
    assert set(mats) == {"encoder", "decoder"} and set(mats["encoder"]) == {0, 1}
    h = model.config.encoder_attention_heads
    assert mats["encoder"][0].shape == (h, 10, 10)
    torch.testing.assert_close(mats["encoder"][1].sum(-1), torch.ones(h, 10))
    assert (mats["decoder"][0].triu(1) == 0).all()
    raw = learned_attention(model, length=10, normalize=False)
    torch.testing.assert_close(raw["encoder"][1], model.model.encoder.ran_stack.matrices(10)[1])
    ent = attention_entropy(mats)
    assert 0 < ent["encoder"][0] <= math.log(10) + 1e-5
    syn = learned_attention(tiny_model("marian", "synthesizer", synthesizer_max_positions=16))
    assert syn["decoder"][1].shape[-1] == 16
    with pytest.raises(ValueError, match="no RAN or Synthesizer"):
        learned_attention(tiny_model("marian", "softmax"))
    pytest.importorskip("matplotlib")
    path = plot_attention_heatmaps(mats, str(tmp_path / "fig6.png"))
    assert (tmp_path / "fig6.png").stat().st_size > 0 and path.endswith("fig6.png")
    plot_attention_heatmaps(mats, str(tmp_path / "fig6_h1.png"), head=1)


def test_presets_are_registered():
    for name in ("ran-e", "ran-d", "ran-all", "ran-all-fixed-init", "ran-e-no-pos", "ran-d-no-pos",
                 "hard-gaussian", "hard-gaussian-cross", "synthesizer"):
        assert name in hf_attn.PRESETS
    assert hf_attn.PRESETS["ran-d"].overrides["decoder_attention"] == "recurrent"
