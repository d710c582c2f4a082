"""ReLUFormer (Shen et al. 2023): the per-query scale sqrt(n/2), the regulariser L_reg
(hand computation, finiteness, averaging, its gradient through the trainer with label smoothing), query chunking
for long inputs, and config errors. The preset contract is in
tests/test_presets.py (training, beam, cache, Hub round trip) and tests/contract/ (the returned weights)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import EOS, PAD, tiny_batch, tiny_config, tiny_model

import hf_attn
from hf_attn.modeling import attention_reluformer as rf
from hf_attn.modeling.hyperparameters import HfAttnConfigError
from hf_attn.modeling.masking import KeepMask

PRESETS = ("reluformer", "reluformer-no-scale", "reluformer-no-reg")


def relu_module(model, site="encoder", layer=0):
    return model.attention_modules(site)[layer]


def strong_model(base, preset="reluformer", **kw):
    """A tiny model whose attention matters: q/k/v/out weights x8 (at init they barely move the residual stream)."""
    model = tiny_model(base, preset, **kw)
    with torch.no_grad():
        for m in model.attention_modules():
            for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
                proj.weight.mul_(8.0)
    return model


def padded_length_n(monkeypatch):
    """Break the implementation on purpose: n = the padded key length instead of the visible keys."""
    monkeypatch.setattr(rf, "visible_keys", lambda keep: torch.full((1, 1, keep.q_len, 1), keep.k_len))


# ---------------------------------------------------------------------------------------------------------------
# names: the variant `reluformer` (`relu` before) is ReLUFormer; the preset `relu` is ReLA without norm
# ---------------------------------------------------------------------------------------------------------------
def test_variant_and_presets_are_registered_without_ambiguity():
    assert hf_attn.ATTENTION_VARIANTS["reluformer"] is rf.ReluFormerAttention
    assert "relu" not in hf_attn.ATTENTION_VARIANTS
    for name in PRESETS:
        layout = tiny_config("marian", name).attention_layout()
        assert all(v == "reluformer" for site in layout.values() for v in site)
    assert tiny_config("marian", "relu").attention_layout()["encoder"] == ["rela", "rela"]  # the ReLA preset
    assert "not ReLA" in rf.ReluFormerAttention.description
    assert tiny_config("marian", "reluformer-no-scale").reluformer_scale is False
    assert tiny_config("marian", "reluformer-no-reg").reluformer_reg_weight == 0.0
    assert tiny_config("marian", "reluformer").reluformer_reg_weight == 0.05


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("reluformer_gamma", 0.0, "reluformer_gamma=0.0 must be a finite number > 0"),
        ("reluformer_reg_weight", -1.0, "reluformer_reg_weight=-1.0 must be a finite number >= 0"),
        ("reluformer_entropy_bound", float("nan"), "reluformer_entropy_bound=nan"),
        ("reluformer_eps", 0.5, "reluformer_eps=0.5 must be in (0, 0.01]"),
        ("reluformer_query_chunk", -3, "reluformer_query_chunk=-3 must be an integer >= 0"),
        ("reluformer_scale", "yes", "reluformer_scale='yes' must be true or false"),
    ],
)
def test_config_errors_name_value_and_limit(key, value, fragment):
    with pytest.raises(HfAttnConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        tiny_config("marian", "reluformer", **{key: value})


def test_configs_saved_with_the_old_variant_name_load(tmp_path):
    """config.json files written when the variant was called `relu` load as `reluformer` (single name and lists)."""
    import json

    config = tiny_config("marian", "reluformer", reluformer_gamma=2.0)
    config.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    assert saved["encoder_attention"] == "reluformer"
    saved.update(encoder_attention="relu", decoder_attention=["relu", "softmax"], cross_attention="relu")
    path.write_text(json.dumps(saved))
    loaded = hf_attn.HfAttnMarianConfig.from_pretrained(tmp_path)
    assert loaded.encoder_attention == "reluformer" and loaded.decoder_attention == ["reluformer", "softmax"]
    assert loaded.attention_layout() == {
        "encoder": ["reluformer", "reluformer"],
        "decoder": ["reluformer", "softmax"],
        "cross": ["reluformer", "reluformer"],
    }
    assert loaded.reluformer_gamma == 2.0
    model = hf_attn.HfAttnMarianMTModel(loaded)
    assert isinstance(model.attention_modules("encoder")[0], rf.ReluFormerAttention)


def test_unknown_hyperparameter_is_named():
    with pytest.raises(HfAttnConfigError, match="reluformer_gama.*did you mean 'reluformer_gamma'"):
        tiny_config("marian", "reluformer", reluformer_gama=2.0)


# ---------------------------------------------------------------------------------------------------------------
# the scale uses the per-query count of visible keys
# ---------------------------------------------------------------------------------------------------------------
def hand_attention(q, k, v, keep, scaling, gamma=1.0, scale=True):
    """Loops over one head: s_ij = relu(q_i.k_j * scaling) / (gamma sqrt(n_i/2)), n_i = visible keys of query i."""
    T, S = keep.shape
    ctx = torch.zeros(T, v.shape[-1], dtype=torch.float64)
    s = torch.zeros(T, S, dtype=torch.float64)
    for i in range(T):
        n = int(keep[i].sum())
        for j in range(S):
            if keep[i, j]:
                s[i, j] = max(float(q[i] @ k[j]) * scaling, 0.0) / (gamma * math.sqrt(n / 2) if scale else 1.0)
        ctx[i] = s[i] @ v.double()
    return ctx, s


@pytest.mark.parametrize("scale", [True, False])
def test_attend_matches_hand_computation_with_padding_and_causality(scale):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 5, 4, generator=g) for _ in range(3))
    pad = torch.tensor([True, True, True, False, False])
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    for keep in (pad[None, :].expand(5, 5), causal, causal & pad):
        ctx, w, stats = rf.reluformer_attention(q, k, v, KeepMask.from_dense(keep[None, None]), scaling=0.5, gamma=1.3,
                                                scale=scale, need_weights=True)
        ref_ctx, ref_s = hand_attention(q[0, 0], k[0, 0], v[0, 0], keep, 0.5, 1.3, scale)
        torch.testing.assert_close(ctx[0, 0].double(), ref_ctx, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(w[0, 0].double(), ref_s, rtol=1e-5, atol=1e-6)
        assert torch.equal(stats["rows"][0, 0], keep.any(-1))


def encoder_states(model, ids, mask):
    with torch.no_grad():
        return model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_scale_counts_real_source_tokens_not_padding(base, monkeypatch):
    """A sentence's encoder states do not depend on how much padding its batch adds (n = its real length)."""
    model = strong_model(base)
    short = torch.tensor([[5, 6, 7, EOS]])
    ids = torch.full((2, 9), PAD)
    ids[0] = torch.arange(10, 19)
    ids[0, -1] = EOS
    ids[1, :4] = short[0]
    mask = ids.ne(PAD).long()
    alone = encoder_states(model, short, torch.ones_like(short))
    torch.testing.assert_close(encoder_states(model, ids, mask)[1, :4], alone[0], rtol=1e-5, atol=1e-5)
    padded_length_n(monkeypatch)  # the same check fails when n is the padded length
    assert not torch.allclose(encoder_states(model, ids, mask)[1, :4], alone[0], atol=1e-2)


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_causal_scale_is_i_plus_1(base, monkeypatch):
    """Position i of the decoder sees i+1 tokens: its logits do not change when the target grows."""
    model = strong_model(base)
    b = tiny_batch()
    src = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    dec = b["labels"].clamp(min=3)

    def logits(n):
        with torch.no_grad():
            return model(**src, decoder_input_ids=dec[:, :n]).logits

    torch.testing.assert_close(logits(3), logits(7)[:, :3], rtol=1e-5, atol=1e-5)
    padded_length_n(monkeypatch)  # with n = the number of decoder positions the prefix logits would change
    assert not torch.allclose(logits(3), logits(7)[:, :3], atol=1e-2)


def test_incremental_decoding_uses_cache_length_and_real_source_length(monkeypatch):
    model = tiny_model("marian", "reluformer")
    b = tiny_batch()
    seen = []
    original = rf.ReluFormerAttention.attend

    def recording(self, q, k, v, keep, ctx):
        seen.append((self.site, q.shape[2], rf.visible_keys(keep).expand(q.shape[0], 1, q.shape[2], 1)[:, 0, :, 0]))
        return original(self, q, k, v, keep, ctx)

    monkeypatch.setattr(rf.ReluFormerAttention, "attend", recording)
    with torch.no_grad():
        model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"], num_beams=1, do_sample=False,
                       max_new_tokens=5, min_new_tokens=5, use_cache=True)
    src_len = b["attention_mask"].sum(-1)
    self_steps = [n for site, t, n in seen if site == "decoder" and t == 1]
    cross_steps = [n for site, t, n in seen if site == "cross" and t == 1]
    assert len(self_steps) == 2 * 5  # two decoder layers, five steps, one query per step
    for step, n in enumerate(self_steps[::2]):  # layer 0; cache length + 1 = step + 1 keys
        assert torch.equal(n[:, 0], torch.full_like(n[:, 0], step + 1))
    for n in cross_steps:
        assert torch.equal(n[:, 0], src_len)
    enc = [n for site, t, n in seen if site == "encoder"]
    assert torch.equal(enc[0][:, 0], src_len)


# ---------------------------------------------------------------------------------------------------------------
# L_reg
# ---------------------------------------------------------------------------------------------------------------
def test_reg_matches_hand_computation():
    # one head, 2 queries, 3 keys; query 1 sees keys 0-1 (n = 2), query 0 sees all 3 (n = 3); dh = 1, scaling 1
    q = torch.tensor([[[[1.0], [2.0]]]])
    k = torch.tensor([[[[1.0], [0.5], [-1.0]]]])
    v = torch.zeros(1, 1, 3, 1)
    keep = KeepMask.from_dense(torch.tensor([[True, True, True], [True, True, False]])[None, None])
    _, _, st = rf.reluformer_attention(q, k, v, keep, scaling=1.0, entropy_bound=0.7)
    # query 0: relu([1, .5, -1]) / sqrt(3/2) ; query 1: relu([2, 1]) / sqrt(2/2)
    rows = [[1.0 / math.sqrt(1.5), 0.5 / math.sqrt(1.5)], [2.0, 1.0]]
    for i, (s, n) in enumerate(zip(rows, (3, 2))):
        total = sum(s)
        p = [x / total for x in s]
        h = -sum(x * math.log(x) for x in p)
        assert st["norm"][0, 0, i].item() == pytest.approx(abs(math.log(total)), rel=1e-6)
        assert st["entropy"][0, 0, i].item() == pytest.approx(h, rel=1e-5)
        assert st["margin"][0, 0, i].item() == pytest.approx(max(h - 0.7 * math.log(n), 0.0), abs=1e-6)
        assert st["row_sum"][0, 0, i].item() == pytest.approx(total, rel=1e-6)
    # both rows have p = (2/3, 1/3), H = 0.6365: below C = 0.7 log 3 = 0.769 (margin 0), above 0.7 log 2 = 0.485
    assert st["margin"][0, 0, 0].item() == 0.0 and st["margin"][0, 0, 1].item() == pytest.approx(0.1513, abs=1e-3)


def test_reg_is_finite_for_all_zero_rows_and_single_keys():
    q = torch.tensor([[[[1.0], [-1.0], [3.0]]]], requires_grad=True)
    k = torch.tensor([[[[1.0], [2.0]]]], requires_grad=True)  # query 1 scores only negatives: an all-zero row
    v = torch.randn(1, 1, 2, 1, requires_grad=True)
    keep = KeepMask.from_dense(torch.tensor([[True, True], [True, True], [True, False]])[None, None])  # query 2: n = 1
    ctx, _, st = rf.reluformer_attention(q, k, v, keep, scaling=1.0, eps=1e-6)
    assert st["norm"][0, 0, 1].item() == pytest.approx(abs(math.log(1e-6)))
    assert st["entropy"][0, 0, 1].item() == 0.0 and st["margin"][0, 0, 1].item() == 0.0
    assert st["entropy"][0, 0, 2].item() == pytest.approx(0.0, abs=1e-6) and st["margin"][0, 0, 2].item() == 0.0
    loss = ctx.sum() + sum(st[key].sum() for key in ("norm", "margin", "entropy"))
    loss.backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    # a query without any visible key: no row, zero statistics, no NaN
    ctx, _, st = rf.reluformer_attention(q, k, v, KeepMask.from_dense(torch.zeros(1, 1, 3, 2, dtype=torch.bool)),
                                         scaling=1.0)
    assert not st["rows"].any() and torch.isfinite(ctx).all() and st["norm"].abs().sum() == 0


def test_reg_terms_give_plain_autogradients():
    """`RegTerms` (which keeps the two row sums alone for backward) against Eq. 7 through plain autograd, on rows
    at every edge: sums below eps, S = 1 (log 0), entropy at and below C, entropy clamped at 0, rows masked out."""
    g = torch.Generator().manual_seed(0)
    total = torch.rand(2, 3, 40, generator=g, dtype=torch.float64) * 3
    total[0, 0, :4] = torch.tensor([0.0, 1e-7, 1.0, 1e-6], dtype=torch.float64)  # below, at eps; log S = 0
    s_log_s = total * (total.log() - torch.rand(2, 3, 40, generator=g, dtype=torch.float64) * 3)
    s_log_s[0, 1, :3] = total[0, 1, :3] * total[0, 1, :3].log()  # a one-hot row: H = 0
    s_log_s[0, 0, 0] = 0.0  # an all-zero row: sum_j 0 log 0 = 0
    s_log_s[1, 2, :3] = total[1, 2, :3] * (total[1, 2, :3].log() + 1.0)  # H = log S - (log S + 1) < 0: clamped
    nf = torch.randint(1, 30, (2, 1, 40), generator=g).double()
    rows = nf > 1
    weights = torch.randn(3, 2, 3, 40, generator=g, dtype=torch.float64)

    def plain(raw, sls):  # the equations as written, autograd through every step
        t = raw.clamp(min=1e-6)
        ent = (t.log() - sls / t).clamp(min=0.0)
        return t.log().abs() * rows, F.relu(ent - 0.7 * nf.log()) * rows, ent * rows

    leaves = [[x.clone().requires_grad_() for x in (total, s_log_s)] for _ in range(2)]
    st = rf.row_statistics(*leaves[0], nf, rows, 1e-6, 0.7)
    ref = plain(*leaves[1])
    for got, want in zip((st["norm"], st["margin"], st["entropy"]), ref):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    ((st["norm"] * weights[0]).sum() + (st["margin"] * weights[1]).sum()).backward()
    ((ref[0] * weights[0]).sum() + (ref[1] * weights[1]).sum()).backward()
    for got, want in zip(leaves[0], leaves[1]):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-12, atol=1e-12)
    assert leaves[0][1].grad.abs().sum() > 0 and (leaves[0][0].grad[0, 0, :2] == 0).all()


@pytest.mark.parametrize("base", ["marian", "bart"])
def test_one_token_inputs_and_autocast_are_finite(base):
    model = tiny_model(base, "reluformer", dropout=0.1, attention_dropout=0.1).train()
    ids = torch.tensor([[EOS], [EOS]])
    labels = torch.tensor([[EOS], [EOS]])
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    assert torch.isfinite(out.loss) and torch.isfinite(out.aux_loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = model(**tiny_batch())
        assert torch.isfinite(out.loss) and torch.isfinite(out.aux_loss), dtype
        assert all(torch.isfinite(v) for v in out.aux_logs.values())


def fake_stats(reg_rows, rows):
    """A layer's statistics as it leaves them: from [B,H,T] rows, summed over heads."""
    zeros = torch.zeros_like(reg_rows)
    return rf.head_sums({"norm": reg_rows, "margin": zeros, "entropy": zeros + 1.0, "row_sum": zeros,
                         "rows": rows.expand_as(reg_rows)})


def test_reg_is_averaged_over_valid_queries_heads_then_layers():
    from hf_attn.modeling.forward_state import ForwardState

    # encoder layer: B=1, H=2, S=3, last source token is padding ; decoder layer: T=2, second position is padding
    variant = rf.ReluFormerAttention.variant
    state = ForwardState()
    state.layer_stats[(variant, "encoder", 0)] = fake_stats(
        torch.tensor([[[1.0, 2.0, 100.0], [3.0, 4.0, 100.0]]]), torch.ones(1, 1, 3, dtype=torch.bool))
    state.layer_stats[(variant, "decoder", 0)] = fake_stats(
        torch.tensor([[[5.0, 100.0], [7.0, 100.0]]]), torch.ones(1, 1, 2, dtype=torch.bool))
    state.layer_stats[("calibrated", "cross", 0)] = {"other": "variant"}  # another variant's statistics: ignored
    model = SimpleNamespace(config=SimpleNamespace(reluformer_reg_weight=0.5, pad_token_id=PAD))
    inputs = {"attention_mask": torch.tensor([[1, 1, 0]]), "decoder_input_ids": torch.tensor([[PAD, PAD]])}
    losses, logs = rf.ReluFormerAttention.model_losses(model, None, inputs, state)
    expected = ((1 + 2 + 3 + 4) / 4 + (5 + 7) / 2) / 2  # per layer over valid (query, head), then over layers
    assert logs["reg_loss"].item() == pytest.approx(expected)
    assert losses["reluformer_reg"].item() == pytest.approx(0.5 * expected)
    assert logs["attn_entropy"].item() == pytest.approx(1.0)


def test_model_reports_reg_and_no_reg_preset_only_logs_it():
    b = tiny_batch()
    with_reg = tiny_model("marian", "reluformer")(**b)
    no_reg = tiny_model("marian", "reluformer-no-reg")(**b)
    weight = tiny_config("marian", "reluformer").reluformer_reg_weight
    assert with_reg.aux_loss.item() == pytest.approx(weight * with_reg.aux_logs["reg_loss"].item())
    assert with_reg.loss.item() == pytest.approx(no_reg.loss.item() + with_reg.aux_loss.item(), rel=1e-5)
    assert no_reg.aux_loss is None and no_reg.aux_logs["reg_loss"].item() == pytest.approx(with_reg.aux_logs["reg_loss"].item())
    assert set(with_reg.aux_logs) == {"reg_loss", "reg_norm_term", "reg_entropy_term", "attn_entropy", "attn_row_sum"}
    # the same L_reg whether the model gets labels or (label smoothing) only decoder_input_ids
    model = tiny_model("marian", "reluformer")
    dec = model.prepare_decoder_input_ids_from_labels(labels=b["labels"])
    smoothed_path = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], decoder_input_ids=dec)
    assert smoothed_path.loss is None
    assert smoothed_path.aux_loss.item() == pytest.approx(with_reg.aux_loss.item(), rel=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# L_reg reaches the optimiser through the trainer, with label smoothing
# ---------------------------------------------------------------------------------------------------------------
def _trainer(tmp_path, reg_weight, **kw):
    from tiny_trainer import Tok, data, targs  # the trainer tests' tiny tokenizer / data / arguments

    from hf_attn.data import make_collator
    from hf_attn.training import HfAttnSeq2SeqTrainer

    torch.manual_seed(0)
    cfg = hf_attn.HfAttnMarianConfig.from_preset(
        "reluformer", vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
        pad_token_id=39, decoder_start_token_id=39, eos_token_id=0, forced_eos_token_id=0, dropout=0.0,
        reluformer_reg_weight=reg_weight)
    model = hf_attn.HfAttnMarianMTModel(cfg)
    return HfAttnSeq2SeqTrainer(model=model, args=targs(tmp_path, **kw), train_dataset=data(),
                                data_collator=make_collator(Tok(), model))


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_label_smoothed_loss_gradient_includes_reg(tmp_path):
    trainer = _trainer(tmp_path, reg_weight=2.0, label_smoothing_factor=0.1)
    model = trainer.model.train()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(8)])
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    total = _grads(model)
    model.zero_grad()
    out = model(**batch)
    labels = batch["labels"]
    logp = torch.log_softmax(out.logits, -1)
    mask = labels != -100
    nll = -logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)[mask].mean()
    smoothed = 0.9 * nll + 0.1 * (-logp.mean(-1)[mask].mean())
    assert out.aux_loss.item() == pytest.approx(2.0 * out.aux_logs["reg_loss"].item()) and out.aux_loss.item() > 0.1
    torch.testing.assert_close(loss, smoothed + out.aux_loss, rtol=1e-5, atol=1e-5)
    smoothed.backward(retain_graph=True)
    translation_only = _grads(model)
    model.zero_grad()
    out.aux_loss.backward()
    reg_only = _grads(model)
    q = "model.encoder.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(total[q], translation_only[q], atol=1e-6)  # fails if L_reg were dropped
    for name, g in total.items():
        torch.testing.assert_close(g, translation_only[name] + reg_only.get(name, 0 * g), rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_trainer_logs_reg_loss_and_entropy(tmp_path):
    trainer = _trainer(tmp_path, reg_weight=1.0, label_smoothing_factor=0.1, max_steps=2)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    for h in logs:
        assert {"reg_loss", "attn_entropy", "reg_norm_term", "reg_entropy_term", "aux_loss"} <= set(h)
        assert h["aux_loss"] == pytest.approx(h["reg_loss"], rel=1e-4) and h["attn_entropy"] >= 0


# ---------------------------------------------------------------------------------------------------------------
# long inputs: chunking over queries
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base", ["marian", "bart"])
def test_query_chunks_give_the_same_values_and_gradients(base):
    b = tiny_batch(src_len=13, tgt_len=11)
    results = {}
    for chunk in (0, 4):
        model = tiny_model(base, "reluformer", reluformer_query_chunk=chunk).train()
        out = model(**b)
        out.loss.backward()
        results[chunk] = (out.loss.detach(), out.aux_loss.detach(), _grads(model))
        with torch.no_grad():
            att = model(**b, output_attentions=True)
        results[chunk] += (att.encoder_attentions[0], att.decoder_attentions[1], att.cross_attentions[0])
    (l0, a0, g0, *w0), (l4, a4, g4, *w4) = results[0], results[4]
    torch.testing.assert_close(l4, l0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a4, a0, rtol=1e-5, atol=1e-6)
    for name in g0:
        torch.testing.assert_close(g4[name], g0[name], rtol=1e-4, atol=1e-6)
    for x, y in zip(w4, w0):
        torch.testing.assert_close(x, y)


def test_chunked_training_with_dropout_is_finite():
    model = tiny_model("marian", "reluformer", reluformer_query_chunk=3, dropout=0.1, attention_dropout=0.3).train()
    out = model(**tiny_batch(src_len=13, tgt_len=11))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------------------------------------------
# analysis: entropy / top-p% mass summaries (hf_attn.analysis.reluformer)
# ---------------------------------------------------------------------------------------------------------------
def test_top_p_mass_by_hand():
    from hf_attn.analysis.stats import top_p_mass

    w = torch.tensor([[[[4.0, 3.0, 2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]]]])
    keep = torch.tensor([[True, True, True, True, False], [True, True, True, True, True]])[None, None]
    # row 0: n = 4, top ceil(0.3 * 4) = 2 entries hold 7/10 ; row 1 is null (excluded)
    assert top_p_mass(w, keep, p=0.3) == pytest.approx(0.7)
    assert top_p_mass(w, keep, p=1.0) == pytest.approx(1.0)


class WordTok:
    """Enough tokenizer for attention_summary: words -> ids, EOS appended, right padding."""

    pad_token_id = PAD

    def __call__(self, texts, text_target, padding, truncation, max_length, return_tensors):
        def encode(batch):
            ids = [[3 + sum(map(ord, w)) % 50 for w in t.split()][: max_length - 1] + [EOS] for t in batch]
            n = max(map(len, ids))
            return torch.tensor([x + [PAD] * (n - len(x)) for x in ids]), torch.tensor(
                [[1] * len(x) + [0] * (n - len(x)) for x in ids])

        ids, mask = encode(texts)
        labels, _ = encode(text_target)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_attention_summary_reports_entropy_per_site():
    from hf_attn.analysis.reluformer import attention_summary

    src = ["a b c d", "e f", "g h i j k l"]
    tgt = ["x y z", "w", "u v t s"]
    out = {p: attention_summary(strong_model("marian", p), WordTok(), src, tgt, batch_size=2)
           for p in ("softmax", "reluformer")}
    for summary in out.values():
        assert set(summary) >= {"encoder", "decoder", "cross", "mean_entropy"} and summary["sentences"] == 3
        for site in ("encoder", "decoder", "cross"):
            assert summary[site]["entropy"] >= 0 and 0 < summary[site]["top_p_mass"] <= 1 + 1e-6
    assert out["softmax"]["encoder"]["sparsity"] == 0.0 and out["reluformer"]["encoder"]["sparsity"] > 0
