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
    assert stats.head_diversity(same, keep, renormalise=False).item() == pytest.approx(0.0, abs=1e-6)
    differ = torch.stack([torch.tensor([1.0, 0, 0]), torch.tensor([0, 1.0, 0])])[None, :, None, :]
    assert stats.head_diversity(differ, keep, renormalise=False).item() == pytest.approx(math.log(2), abs=1e-6)
    null_vs_one_hot = torch.stack([torch.zeros(3), torch.tensor([1.0, 0, 0])])[None, :, None, :]
    # a null row is one-hot on the dummy slot: disjoint from the other head -> log 2
    assert stats.head_diversity(null_vs_one_hot, keep, renormalise=False).item() == pytest.approx(math.log(2))


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
