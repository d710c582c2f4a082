"""The papers' tables and figures (`hf-attn analyze --figures`): hand-checked helpers, then each figure on a tiny
model with a whitespace tokenizer."""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import replace

import pytest
import torch
from conftest import EOS, PAD, tiny_model

from hf_attn.analysis import alignment, common, figures, rela
from hf_attn.analysis.options import AnalyzeOptions
from hf_attn.errors import HfAttnInputError

pytestmark = pytest.mark.usefixtures("one_thread")


class WordTokenizer:
    """Whitespace words -> ids; a word longer than 4 characters is two subwords ("▁w.." + a continuation)."""

    pad_token_id, eos_token_id = PAD, EOS
    all_special_tokens = ("<s>", "<pad>", "</s>")

    def encode(self, text, special=True, max_length=None):
        ids = []
        for w in text.split():
            ids.append(3 + zlib.crc32(w.encode()) % 30)
            if len(w) > 4:
                ids.append(33 + zlib.crc32(w[4:].encode()) % 31)
        ids = ids + [EOS] if special else ids
        return ids[:max_length] if max_length else ids

    def _pad(self, seqs):
        n = max(map(len, seqs))
        ids = torch.tensor([s + [PAD] * (n - len(s)) for s in seqs])
        return ids, torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])

    def __call__(self, text, text_target=None, padding=False, truncation=False, max_length=None, return_tensors=None,
                 add_special_tokens=True):
        single = isinstance(text, str)
        seqs = [self.encode(t, add_special_tokens, max_length if truncation else None) for t in ([text] if single else text)]
        if not return_tensors:
            return {"input_ids": seqs[0] if single else seqs}
        ids, mask = self._pad(seqs)
        out = {"input_ids": ids, "attention_mask": mask}
        if text_target is not None:
            targets = [text_target] if single else text_target
            out["labels"] = self._pad([self.encode(t, True, max_length if truncation else None) for t in targets])[0]
        return out

    def convert_ids_to_tokens(self, ids):
        return [self.all_special_tokens[i] if i < 3 else (f"\u2581w{i}" if i < 33 else f"c{i}") for i in ids]

    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(t for t in self.convert_ids_to_tokens(row.tolist()) if t not in self.all_special_tokens)
                for row in ids]


SOURCES = ["das ist gut", "im anfang war das wort", "und das wort war bei gott", "ja", "er sprach zu ihnen",
           "siehe ich komme bald", "die erde war wüst und leer", "es werde licht"]
TARGETS = ["that is good", "in the beginning was the word", "and the word was with god", "yes",
           "he said to them", "behold i come quickly", "the earth was without form", "let there be light"]


def options(**overrides) -> AnalyzeOptions:
    small = dict(batch_size=4, num_beams=1, speed_groups=3, speed_batch_sizes=(1, 4), speed_beams=(1, 2),
                 top_p_values=(0.1, 0.5), long_lengths=(8, 16), kendall_sentences=3, bins=10, alignment_layer=-1)
    return AnalyzeOptions(model_dirs=("unused",), **{**small, **overrides})


def context(preset, **overrides):
    model = tiny_model("marian", preset, max_position_embeddings=64)
    return figures.Context(model, WordTokenizer(), preset, list(SOURCES), list(TARGETS), options(**overrides))


# ---- shared pieces -----------------------------------------------------------------------------------------------------
def test_length_buckets_by_hand():
    assert [common.bucket_of(n, (20, 40)) for n in (1, 20, 21, 40, 41, 500)] == [0, 0, 1, 1, 2, 2]
    assert common.bucket_labels((20, 40)) == ["(0,20]", "(20,40]", "(40,inf)"]
    assert common.equal_count_groups([5, 1, 9, 3], 2) == [[1, 3], [0, 2]]
    assert common.equal_count_groups([4, 2, 8, 6, 1], 10) == [[4], [1], [0], [3], [2]]  # empty groups dropped


def test_jsd_entropy_and_kendall_by_hand():
    p = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0]])
    assert common.jsd(p, p).tolist() == pytest.approx([0.0, 0.0], abs=1e-7)
    assert common.jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == pytest.approx(math.log(2))
    assert common.jsd(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 0.5])).item() == pytest.approx(math.log(2))
    assert common.row_entropy(torch.tensor([1.0, 1.0, 0.0, 0.0])).item() == pytest.approx(math.log(2))
    assert common.kendall_tau([3, 1, 2], [30, 10, 20]) == pytest.approx(1.0)
    assert common.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert common.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx((5 - 1) / 6)
    assert math.isnan(common.kendall_tau([1, 1], [1, 2]))


def test_bleu_by_bucket():
    refs = ["a b c d", "a b c d e f g h i j k l", "x y z w"]
    rows = common.bleu_by_bucket(refs, refs, [4, 12, 4], (5, 10))
    assert [r["sentences"] for r in rows] == [2, 0, 1]
    assert rows[0]["bleu"] == pytest.approx(100) and rows[1]["bleu"] is None and rows[2]["bleu"] == pytest.approx(100)


# ---- ReLA: alignment ---------------------------------------------------------------------------------------------------
def test_pharaoh_file_parsing(tmp_path):
    f = tmp_path / "gold.txt"
    f.write_text("0-0 1-1 2?1\n\n3p2 0-1\n")
    assert alignment.read_pharaoh(f) == [({(0, 0), (1, 1)}, {(0, 0), (1, 1), (2, 1)}), (set(), set()),
                                         ({(0, 1)}, {(3, 2), (0, 1)})]
    f.write_text("0-0 1:1\n")
    with pytest.raises(HfAttnInputError, match=r"line 1: '1:1' is not a Pharaoh link"):
        alignment.read_pharaoh(f)


def test_subwords_merge_into_words_and_a_hand_built_alignment_has_a_known_aer():
    tokens = ["\u2581Im", "\u2581An", "fang", "</s>"]
    assert alignment.word_index(tokens, {"</s>"}) == [0, 1, 1, -1]
    # target: "In the beginning" as In / the / begin+ning, then EOS; attention [H=1, T=5, S=4]
    w = torch.tensor([[[0.8, 0.1, 0.1, 0.0], [0.2, 0.3, 0.5, 0.0], [0.1, 0.6, 0.3, 0.0], [0.5, 0.25, 0.25, 0.0],
                       [0.0, 0.0, 0.0, 1.0]]])
    words = alignment.merge_subwords(w, [0, 1, 1, -1], [0, 1, 2, 2, -1])[0]
    # source "An"+"fang" summed; target "begin"+"ning" averaged: ((0.1+0.5)/2, (0.9+0.5)/2)
    assert torch.allclose(words, torch.tensor([[0.8, 0.2], [0.2, 0.8], [0.3, 0.7]]))
    predicted = alignment.argmax_alignment(words)
    assert predicted == {(0, 0), (1, 1), (1, 2)}
    # gold: sure 0-0 1-2, possible 1?1 -> |A|=3 |S|=2 |A&S|=2 |A&P|=3 -> AER = 1 - 5/5 = 0, P = 1, R = 1
    assert alignment.scores(alignment.counts(predicted, {(0, 0), (1, 2)}, {(1, 1)})) == {
        "aer": 0.0, "precision": 1.0, "recall": 1.0}
    # gold sure 0-0 0-1: |A&S| = 1, |A&P| = 1 -> AER = 1 - 2/5, P = 1/3, R = 1/2
    s = alignment.scores(alignment.counts(predicted, {(0, 0), (0, 1)}, set()))
    assert s == pytest.approx({"aer": 0.6, "precision": 1 / 3, "recall": 0.5})


def test_aer_per_layer_on_a_tiny_model_against_its_own_alignment(tmp_path):
    ctx = context("rela-g")
    out = figures.rela_alignment(ctx)  # last layer, shifted attention
    lines = out["alignments"]
    assert out["layer"] == 1 and len(lines) == 8 and all(set(x) <= set("0123456789- ") for x in lines)
    (tmp_path / "gold.txt").write_text("\n".join(lines) + "\n")
    ctx.options = replace(ctx.options, gold_alignments=str(tmp_path / "gold.txt"), plot_dir=str(tmp_path))
    out = figures.rela_aer(ctx)
    assert out["shifted"]["layers"][-1]["aer"] == pytest.approx(0.0)  # the gold is that layer's own alignment
    assert out["shifted"]["skipped"] == 0 and len(out["normal"]["layers"]) == 2
    assert all(r["best_head_aer"] <= max(r["head_aer"]) for r in out["normal"]["layers"])
    assert out["shifted"]["AoH"] == pytest.approx(sum(r["best_head_aer"] for r in out["shifted"]["layers"]) / 2)
    assert (tmp_path / "rela-g_rela-aer.png").stat().st_size > 5000
    gmm = figures.gmm_alignment(ctx)
    assert gmm["layer"] == 0 and 0 <= gmm["precision"] <= 1 and 0 <= gmm["recall"] <= 1
    ctx.options = replace(ctx.options, gold_alignments=None)
    assert figures.run_figures(ctx, ["rela-aer"])["rela-aer"]["skipped"].startswith("needs --gold-alignments")


# ---- ReLA: null rate ---------------------------------------------------------------------------------------------------
def test_shuffles_move_every_chosen_target_and_top_share_counts_by_hand():
    items = list("abcdefgh")
    assert all(x != y for x, y in zip(items, rela.derange(items, seed=3)))
    moved_targets, moved = rela.shuffle_subset(items, 0.25, seed=1)
    assert len(moved) == 2 and all(moved_targets[i] != items[i] for i in moved)
    assert [t for i, t in enumerate(moved_targets) if i not in moved] == [t for i, t in enumerate(items) if i not in moved]
    assert rela.rank_by_null_rate([0.1, 0.5, 0.3, 0.5]) == [1, 3, 2, 0]
    assert rela.top_share_hits([1, 3, 2, 0, 4, 5, 6, 7, 8, 9], [3, 2], top=0.2) == 1  # top 2 = {1, 3}
    assert rela.top_share_hits(list(range(25)), [2], top=0.1) == 1  # ceil(2.5) = 3 pairs


def test_null_rate_shuffled_and_the_ranking_demo(tmp_path):
    ctx = context("rela-g", plot_dir=str(tmp_path), shuffle_fraction=0.25, rank_output=str(tmp_path / "rank.tsv"),
                  top_share=0.5)
    out = figures.rela_null_shuffled(ctx)
    assert set(out) == {"original", "shuffled"} and len(out["shuffled"]["cross"]) == 2
    assert all(0 <= x <= 1 for x in out["shuffled"]["cross"])
    demo = figures.rela_rank_null(ctx)
    assert demo["shuffled"] == 2 and 0 <= demo["shuffled_in_top"] <= 2 and demo["expected_by_chance"] == 1.0
    rows = (tmp_path / "rank.tsv").read_text().splitlines()
    assert rows[0].startswith("rank\tnull_rate") and len(rows) == 9
    rates = [float(r.split("\t")[1]) for r in rows[1:]]
    assert rates == sorted(rates, reverse=True)
    assert sum(int(r.split("\t")[3]) for r in rows[1:]) == 2
    assert (tmp_path / "rela-g_rela-null-shuffled.png").stat().st_size > 5000


def test_speed_and_bleu_by_length(tmp_path):
    ctx = context("ran-all", plot_dir=str(tmp_path))
    speed = figures.rela_speed(ctx)["groups"]
    assert [r["sentences"] for r in speed] == [3, 2, 3] and all(r["sentences_per_second"] > 0 for r in speed)
    assert speed[0]["mean_source_words"] <= speed[-1]["mean_source_words"]
    ran = figures.ran_speed(ctx)
    assert [r["batch_size"] for r in ran["by_batch_size"]] == [1, 4] and [r["num_beams"] for r in ran["by_beam_size"]] == [1, 2]
    bleu = figures.ran_bleu(ctx)
    assert sum(r["sentences"] for r in bleu["by_source_length"]) == 8 and len(bleu["by_target_length"]) == 7
    assert figures.gmm_bleu(ctx)["by_source_length"][0]["sentences"] == 8  # all <= 10 words
    for name in ("rela-speed", "ran-speed", "ran-bleu", "gmm-bleu"):
        assert (tmp_path / f"ran-all_{name}.png").stat().st_size > 5000


# ---- GMM, ReLUFormer, calibration, RAN -------------------------------------------------------------------------------
def test_gmm_entropy_by_source_length(tmp_path):
    out = figures.gmm_entropy(context("gmm", plot_dir=str(tmp_path)))
    assert set(out) == {"mixture", "dot_product", "fused"}
    for v in out.values():  # every source is short: "all" = "(0,20]", the other buckets are empty
        assert v["all"] == pytest.approx(v["(0,20]"]) and v["(20,40]"] is None and v["all"] >= 0
    assert set(figures.gmm_entropy(context("softmax"))) == {"attention"}  # the baseline row
    assert (tmp_path / "gmm_gmm-entropy.png").stat().st_size > 5000


def test_reluformer_entropy_and_mass_by_layer_and_length(tmp_path):
    tok = WordTokenizer()
    from hf_attn.analysis.reluformer import long_documents

    src, tgt = long_documents(tok, ["a b", "c d e", "f", "g h i j"], ["A", "B", "C", "D"], limit=4)
    assert src == ["a b", "c d e f", "g h i j"] and tgt == ["A", "B C", "D"]
    ctx = context("reluformer", plot_dir=str(tmp_path))
    layers = figures.reluformer_layers(ctx)
    assert set(layers) == {"encoder", "decoder", "cross"} and len(layers["encoder"]) == 2
    mass = layers["encoder"][0]["top_p_mass"]
    assert 0 < mass["0.1"] <= mass["0.5"] <= 1 + 1e-6
    long = figures.reluformer_long(ctx)
    assert set(long) == {"8", "16"} and long["16"]["documents"] < long["8"]["documents"] <= 8
    ctx.options = replace(ctx.options, long_lengths=(100,))
    with pytest.raises(HfAttnInputError, match=r"--long_lengths 100: .* 64 positions.*<= 62"):
        figures.reluformer_long(ctx)
    assert (tmp_path / "reluformer_reluformer-long.png").stat().st_size > 5000


def test_calibration_jsd_entropy_change_and_kendall(tmp_path):
    ctx = context("calibration-gate", plot_dir=str(tmp_path))
    jsd = figures.calibration_jsd(ctx)
    assert jsd["layers"] and all(r["jsd"] >= 0 for r in jsd["layers"])
    buckets = figures.calibration_jsd_entropy(ctx)["buckets"]
    assert [b["bucket"] for b in buckets] == ["(0,0.8]", "(0.8,1.6]", "(1.6,2.4]", "(2.4,3.2]", "(3.2,inf)"]
    ent = figures.calibration_entropy(ctx)
    for r in ent["layers"]:
        assert r["entropy_change"] == pytest.approx(r["entropy_original"] - r["entropy_calibrated"])
    kendall = figures.calibration_kendall(ctx)
    assert kendall["sentences"] == 3 and len(kendall["attention"]) == 2 and kendall["mask"]
    assert all(-1 <= r["kendall_tau"] <= 1 for rows in (kendall["attention"], kendall["mask"]) for r in rows)
    assert figures.run_figures(context("softmax"), ["calibration-jsd"])["calibration-jsd"]["skipped"]
    assert (tmp_path / "calibration-gate_calibration-kendall.png").stat().st_size > 5000


def test_calibration_jsd_is_zero_when_calibration_changes_nothing(monkeypatch):
    from hf_attn.analysis import calibration

    real = calibration.calibration_maps

    def unchanged(*a, **k):
        return {i: {**r, "combined": r["attention"]} for i, r in real(*a, **k).items()}

    monkeypatch.setattr(calibration, "calibration_maps", unchanged)
    ctx = context("calibration-fixed")
    assert all(r["jsd"] == pytest.approx(0, abs=1e-6) for r in figures.calibration_jsd(ctx)["layers"])
    assert figures.calibration_entropy(ctx)["all"] == pytest.approx(0, abs=1e-6)


def test_ran_histograms_and_layer_pair_jsd(tmp_path):
    ctx = context("ran-all", plot_dir=str(tmp_path))
    hist = figures.ran_histograms(ctx)["histograms"]
    assert all(sum(h) == pytest.approx(1) and len(h) == 10 for layers in hist.values() for h in layers.values())
    jsd = figures.ran_layer_jsd(ctx)
    for m in jsd.values():
        m = torch.tensor(m)
        assert m.diagonal().abs().max() < 1e-6 and torch.allclose(m, m.T, atol=1e-6) and (m >= -1e-7).all()
    assert (tmp_path / "ran-all_ran-layer-jsd.png").stat().st_size > 5000


def test_figure_names_and_flags_are_checked():
    assert figures.parse_figures("all") == list(figures.FIGURES)
    with pytest.raises(HfAttnInputError, match=r"--figures 'gmm-entropi' is not a figure \(did you mean 'gmm-entropy'"):
        figures.parse_figures("gmm-entropy,gmm-entropi")
    assert figures.parse_figures(["gmm-bleu", " ran-bleu"]) == ["gmm-bleu", "ran-bleu"]
    assert figures.check_arguments(options(figures="gmm-bleu", shuffle_fraction=0.2)) == ["gmm-bleu", "rela-rank-null"]
    for overrides, message in [
        ({"shuffle_fraction": 1.5}, r"--shuffle-fraction 1.5: need a share in \(0, 1\)"),
        ({"top_share": 0}, r"--top_share 0: need a share in \(0, 1\]"),
        ({"bins": 0}, r"--bins 0: need at least 1"),
        ({"speed_beams": (1, 0)}, r"--speed_beams 1,0: need a list of int values > 0, e.g. 1,4,8"),
        ({"long_lengths": "128,256"}, r"--long_lengths '128,256': need a list of int values > 0, e.g. 128,256,512"),
        ({"top_p_values": ()}, r"--top_p_values \(\): need a list of float values > 0"),
        ({"top_p_values": [0.1, 2]}, r"--top_p_values 0.1,2: need shares in \(0, 1\]"),
        ({"gold_alignments": "missing.txt"}, r"--gold-alignments 'missing.txt': no such file"),
    ]:
        with pytest.raises(HfAttnInputError, match=message):
            figures.check_arguments(options(**overrides))


@pytest.mark.slow
def test_analyze_command_runs_every_figure(trained, tmp_path, capsys):
    """On the session's tiny run (read only: every output goes to tmp_path)."""
    from training_helpers import bible_pairs, write_jsonl

    from hf_attn.cli import main

    corpus = write_jsonl(tmp_path / "corpus.jsonl", bible_pairs(20, "test"))
    out = tmp_path / "a.json"
    args = ["analyze", str(trained), "--sentences", "6", "--figures", "all", "--rank-null", str(corpus),
            "--shuffle-fraction", "0.1", "--speed_batch_sizes", "2", "--speed_beams", "1", "--speed_groups", "2",
            "--num_beams", "1", "--long_lengths", "32", "--kendall_sentences", "2", "--output", str(out),
            "--plot_dir", str(tmp_path / "plots"), "--rank_output", str(tmp_path / "rank.tsv")]
    assert main(args) == 0
    figs = json.loads(out.read_text())[str(trained)]["figures"]
    assert set(figs) == set(figures.FIGURES)
    assert figs["rela-rank-null"]["pairs"] == 20 and figs["rela-rank-null"]["shuffled"] == 2
    assert figs["calibration-jsd"]["skipped"] and figs["rela-aer"]["skipped"]
    assert "rela-null-shuffled" in figs and len((tmp_path / "rank.tsv").read_text().splitlines()) == 21
    assert "shuffled pairs in the top 10% by null rate" in capsys.readouterr().out
    assert main(["analyze", str(trained), "--figures", "nope"]) == 2
    assert "hf-attn: error: --figures 'nope' is not a figure" in capsys.readouterr().err
