"""Attention statistics against hand computations, and the plots render."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_batch, tiny_model

from hf_attn.analysis import stats


def test_sparsity_null_rate_entropy_by_hand():
    w = torch.tensor([[[[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 9.0]]]])  # [1,1,3,3]
    keep = torch.tensor([[[[True, True, True], [True, True, True], [True, True, False]]]])
    # visible pairs: 8 ; zeros among them: 1 + 3 + 1 = 5 ; the masked 9.0 is ignored
    assert stats.sparsity_rate(w, keep).item() == pytest.approx(5 / 8)
    assert stats.null_rate(w, keep).item() == pytest.approx(1 / 3)
    # rows 0 and 2 are live: entropies log 2 and 0
    assert stats.entropy(w, keep).item() == pytest.approx(math.log(2) / 2)


def test_head_diversity_zero_for_identical_heads_and_positive_otherwise():
    p = torch.tensor([0.7, 0.2, 0.1])
    same = p.expand(1, 2, 1, 3).clone()
    keep = torch.ones(1, 1, 1, 3, dtype=torch.bool)
    assert stats.head_diversity(same, keep, relu_weights=False).item() == pytest.approx(0.0, abs=1e-6)
    differ = torch.stack([torch.tensor([1.0, 0, 0]), torch.tensor([0, 1.0, 0])])[None, :, None, :]
    assert stats.head_diversity(differ, keep, relu_weights=False).item() == pytest.approx(math.log(2), abs=1e-6)
    null_vs_one_hot = torch.stack([torch.zeros(3), torch.tensor([1.0, 0, 0])])[None, :, None, :]
    # a null row is one-hot on the dummy slot: disjoint from the other head -> log 2
    assert stats.head_diversity(null_vs_one_hot, keep, relu_weights=False).item() == pytest.approx(math.log(2))


def test_head_diversity_temperature_smooths_relu_weights_as_in_the_rela_paper():
    """ReLA Table 6: softmax(w ** tau), so a smaller tau is smoother and diversity falls with tau (the old code divided
    by tau: 0.61, 1.02, 1.21 for tau = 1, 0.5, 0.1 on this tensor)."""
    torch.manual_seed(0)
    w = torch.relu(torch.randn(2, 4, 5, 7)) * 3
    keep = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    div = [stats.head_diversity(w, keep, tau, relu_weights=True).item() for tau in (1.0, 0.5, 0.1)]
    assert div[0] > div[1] > div[2] > 0
    # tau only applies to ReLU weights
    assert stats.head_diversity(w, keep, 0.1).item() == pytest.approx(stats.head_diversity(w, keep, 1.0).item())


def test_head_diversity_rescales_weights_that_are_not_distributions():
    """GMM / calibrated / hard-Gaussian rows sum to less than 1: rescale them, never re-softmax them."""
    p = torch.tensor([[0.02, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.03]])[None, :, None, :]  # two heads, tiny mass
    keep = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    # rescaled: two disjoint one-hot distributions -> log 2 (the old re-softmax gave nearly uniform rows: ~0)
    assert stats.head_diversity(p, keep).item() == pytest.approx(math.log(2), abs=1e-5)
    assert stats.head_diversity(p * 30, keep).item() == pytest.approx(math.log(2), abs=1e-5)
    # an all-zero row is null attention: one-hot on the dummy slot, in both treatments
    null = torch.stack([torch.zeros(4), torch.tensor([0.0, 0.5, 0.0, 0.0])])[None, :, None, :]
    for relu in (False, True):
        d = stats.head_diversity(null, keep, relu_weights=relu).item()
        assert d > 0.5, relu
    # layer_statistics picks the treatment per layer from the variant names
    attn = {"cross": stats.SiteAttention([p], keep)}
    assert stats.layer_statistics(attn, variants={"cross": ["gmm"]})["cross"][0]["head_diversity"] == pytest.approx(
        math.log(2), abs=1e-5)
    assert stats.layer_statistics(attn, variants={"cross": ["rela"]})["cross"][0]["head_diversity"] < 0.01


def test_aer_by_hand():
    sure, possible = {(0, 0), (1, 1)}, {(2, 1)}
    assert stats.alignment_error_rate({(0, 0), (1, 1)}, sure, possible) == 0.0
    assert stats.alignment_error_rate({(0, 0), (2, 2)}, sure, possible) == pytest.approx(1 - 2 / 4)
    w = torch.tensor([[[0.1, 0.9], [0.8, 0.2]]])  # [H=1, T=2, S=2]
    assert stats.alignment_from_attention(w, torch.ones(1, 2, 2, dtype=torch.bool)) == {(1, 0), (0, 1)}


def test_layer_statistics_on_a_rela_model(tmp_path):
    model = tiny_model("marian", "rela-g")
    b = tiny_batch()
    attn = stats.collect_attentions(model, b["input_ids"], b["attention_mask"], labels=b["labels"])
    # one analysis pass builds no autograd graph (collect_attentions runs under torch.no_grad)
    assert not any(w.requires_grad for site in attn.values() for w in site.weights)
    table = stats.layer_statistics(attn)
    assert set(table) == {"encoder", "decoder", "cross"}
    for rows in table.values():
        assert len(rows) == 2
        for r in rows:
            assert 0 < r["sparsity"] < 1 and 0 <= r["null_rate"] <= 1 and r["entropy"] >= 0
    soft = stats.layer_statistics(stats.collect_attentions(tiny_model("marian", "softmax"), **{
        "input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": b["labels"]}))
    assert all(r["sparsity"] == 0 and r["null_rate"] == 0 for rows in soft.values() for r in rows)
    png = stats.plot_layer_statistics(table, tmp_path / "stats.png", "rela-g")
    assert png.stat().st_size > 5000
    heads = stats.plot_attention_heads(attn["cross"].weights[0][0], list("abcdefghi"), list("ABCDEFG"), tmp_path / "h.png")
    assert heads.stat().st_size > 5000


def test_a_site_whose_rows_are_all_null_has_no_top_p_mass_not_nan():
    """ReLU attention can switch a whole site off (every row null): its top-p% mass is None, never NaN."""
    from hf_attn.analysis.stats import attention_report, format_report

    class Tok:
        pad_token_id = 1

        def __call__(self, sources, text_target, **kw):
            src = torch.tensor([[5, 6, 7, 2]] * len(sources))
            tgt = torch.tensor([[8, 9, 2]] * len(sources))
            return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": tgt}

    model = tiny_model("marian", "relu")
    with torch.no_grad():
        for layer in model.model.encoder.layers:  # every encoder score negative -> ReLU -> null rows everywhere
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.q_proj.bias.fill_(-1.0)
            layer.self_attn.k_proj.weight.zero_()
            layer.self_attn.k_proj.bias.fill_(1.0)
    rep = attention_report(model, Tok(), ["a"] * 2, ["b"] * 2)
    assert rep["sites"]["encoder"]["null_rate"] == 1.0 and rep["sites"]["encoder"]["top_p_mass"] is None
    assert rep["sites"]["cross"]["top_p_mass"] is not None
    assert "-" in format_report("run", rep).splitlines()[0]


def test_analyze_options_are_checked_before_any_model_is_loaded(tmp_path):
    from hf_attn.analysis.options import AnalyzeOptions
    from hf_attn.analysis.report import check_options
    from hf_attn.errors import HfAttnInputError

    import torch
    from safetensors.torch import save_file

    fake = tmp_path / "never_loaded"  # config.json and complete weights: what check_options looks at, not a model
    fake.mkdir()
    (fake / "config.json").write_text("{}")
    save_file({"x": torch.zeros(1)}, str(fake / "model.safetensors"))
    assert check_options(AnalyzeOptions([str(fake)], figures="gmm-bleu")) == ["gmm-bleu"]
    with pytest.raises(HfAttnInputError, match=r"'never/made' holds no config.json"):  # every directory, first
        check_options(AnalyzeOptions([str(fake), "never/made"]))
    assert AnalyzeOptions(["a"], long_lengths=[8]).long_lengths == (8,)  # lists are kept as tuples
    for options, message in [
        (AnalyzeOptions("runs/rela-g"), r"model_dirs 'runs/rela-g': need a list of model directories"),
        (AnalyzeOptions(()), r"model_dirs \(\): need a list of model directories"),
        (AnalyzeOptions(["d"], sentences=0), r"--sentences 0: need at least 1"),
        (AnalyzeOptions(["d"], split="dev"), r"--split 'dev': valid: test, validation, train"),
        (AnalyzeOptions(["d"], top_p=1.5), r"--top_p 1.5: need a fraction in \(0, 1\]"),
        (AnalyzeOptions(["d"], tau=float("inf")), r"--tau inf: need a temperature > 0"),
        (AnalyzeOptions(["d"], batch_size=0), r"--batch_size 0: need at least 1"),
        (AnalyzeOptions(["d"], figures="gmm-entropi"), r"--figures 'gmm-entropi' is not a figure"),
        (AnalyzeOptions(["d"], speed_batch_sizes=(1, 2.5)), r"--speed_batch_sizes 1,2.5: need a list of int values"),
    ]:
        with pytest.raises(HfAttnInputError, match=message):
            check_options(options)
