"""Seed-aware statistics of `hf-attn reproduce`: the two-level bootstrap, the claims that need 3 seeds, the
"Recipe sensitivity" experiments and the report built from them (synthetic translations; no training)."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest

from hf_attn.errors import HfAttnInputError
from hf_attn.plans.matrix import RunSpec
from hf_attn.report import report as rep
from hf_attn.report.claims import claims_section
from hf_attn.report.experiments import experiments_section, load_experiments
from hf_attn.report.records import SeedComparisons, relative_command
from hf_attn.report.records import test_data_name as split_name  # not a test: pytest would collect the name
from hf_attn.report.seeds import mean_sd, p_text, seed_bootstrap

REAL = Path(__file__).resolve().parents[2] / "results" / "runs" / "de-en_600steps_seed42_softmax.json"
WORDS = "in the beginning was word and god with him all things were made through light life men shone".split()


def _references(n=40):
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(5 + (i * 41) // n)) for i in range(n)]  # 5 to 45 words


REFS = _references()


def _degrade(rate, seed):
    """The references with each word dropped with probability ``rate``: a system whose quality ``rate`` sets."""
    rng = random.Random(seed)
    return [" ".join(w for w in r.split() if rng.random() >= rate) or "the" for r in REFS]


def test_identical_systems_differ_by_nothing():
    runs = [_degrade(0.2, s) for s in (1, 2, 3)]
    s = seed_bootstrap(runs, runs, REFS, n_samples=200)
    for metric in ("bleu", "chrf"):
        assert s[metric]["delta"] == 0 and s[metric]["ci"][0] <= 0 <= s[metric]["ci"][1]
        assert s[metric]["p_value"] > 0.05 and s[metric]["n_a"] == s[metric]["n_b"] == 3
    one = seed_bootstrap(runs[:1], runs[:1], REFS, n_samples=200)["bleu"]
    assert one["ci"] == [0, 0] and one["p_value"] == 1 and one["sd_a"] is None


def test_perfect_system_is_far_above_a_bad_one():
    s = seed_bootstrap([REFS] * 3, [_degrade(0.5, s) for s in (1, 2, 3)], REFS, n_samples=200)["bleu"]
    assert s["a"] == 100 and s["sd_a"] == 0 and s["delta"] > 50 and s["ci"][0] > 40 and s["p_value"] == 0
    assert p_text(s["p_value"]) == "< 0.001"


def test_seed_spread_widens_the_interval():
    baseline = [_degrade(0.3, s) for s in (4, 5, 6)]
    tight = seed_bootstrap([_degrade(0.3, s) for s in (1, 2, 3)], baseline, REFS, n_samples=300)["bleu"]
    spread = seed_bootstrap([_degrade(0.1, 1), _degrade(0.3, 2), _degrade(0.5, 3)], baseline, REFS,
                            n_samples=300)["bleu"]
    assert spread["sd_a"] > 3 * tight["sd_a"]
    assert spread["ci"][1] - spread["ci"][0] > 1.5 * (tight["ci"][1] - tight["ci"][0])


def test_seed_bootstrap_is_deterministic_and_checks_its_input():
    a, b = [_degrade(0.2, s) for s in (1, 2)], [_degrade(0.3, s) for s in (3, 4, 5)]  # 2 seeds against 3
    assert seed_bootstrap(a, b, REFS, n_samples=100) == seed_bootstrap(a, b, REFS, n_samples=100)
    with pytest.raises(HfAttnInputError, match="one translation per reference"):
        seed_bootstrap([REFS[:-1]], b, REFS)
    with pytest.raises(HfAttnInputError, match="at least one run"):
        seed_bootstrap([], b, REFS)


def test_mean_sd_text():
    assert mean_sd([13.45, 14.5, 13.6]) == "13.8 ± 0.6"
    assert mean_sd([14.5]) == "14.5" and mean_sd([]) == "-"
    assert p_text(0.0123) == "0.012"


# -------------------------------------------------------------------------------------------------- records
def _record(out: Path, preset: str, seed: int, hyps: list[str], train_args=(), write=False) -> dict:
    """A real record's fields, with this preset, seed, flags and translations (and the references cached)."""
    import sacrebleu

    spec = RunSpec(preset, "de", "en", 600, seed, "marian", tuple(train_args))
    rec = copy.deepcopy(json.loads(REAL.read_text()))
    bleu = sacrebleu.corpus_bleu(hyps, [REFS])
    rec.update(name=spec.name, setup=spec.setup, spec=asdict(spec) | {"train_args": list(train_args)})
    rec["results"].update(bleu=round(bleu.score, 2), chrf=round(sacrebleu.corpus_chrf(hyps, [REFS]).score, 2))
    rec["results"]["bleu_details"]["bp"] = round(bleu.bp, 4)
    (out / "references").mkdir(parents=True, exist_ok=True)
    for suffix in (".txt", ".src.txt"):
        (out / "references" / f"{split_name(rec)}{suffix}").write_text("\n".join(REFS) + "\n")
    if write:
        (out / "runs").mkdir(exist_ok=True)
        (out / "runs" / f"{spec.name}.json").write_text(json.dumps(rec))
        (out / "runs" / f"{spec.name}.hyp.txt").write_text("\n".join(hyps) + "\n")
    return rec | {"hypotheses": hyps}


def _matrix(out: Path, write=False) -> list[dict]:
    """softmax (good) and rela-g (bad) with seeds 1-3, rela-g with a lower peak for seed 1 only, and a softmax run of
    seed 7 that no experiment lists."""
    return ([_record(out, "softmax", s, _degrade(0.1, s), write=write) for s in (1, 2, 3, 7)] +
            [_record(out, "rela-g", s, _degrade(0.5, s), write=write) for s in (1, 2, 3)] +
            [_record(out, "rela-g", 1, _degrade(0.1, 9), ("--learning_rate", "5e-4"), write=write)])


EXPERIMENTS = {
    "about": "test", "seeds": [1, 2, 3], "pair": "de-en", "base": "marian",
    "experiments": [{
        "id": "recipe", "title": "Peak learning rate", "question": "Does the peak matter?", "steps": 600,
        "arms": {"current": [], "lower": ["--learning_rate", "5e-4"]},
        "cells": ["softmax@current", "rela-g@current", "rela-g@lower", "softmax@lower"],
        "show": ["bp", "entropy.cross", "gmm_gate"],
        "rules": [
            {"claim": "rela-g is behind", "type": "below", "a": "rela-g@current", "b": "softmax@current", "margin": 0},
            {"claim": "rela-g is ahead", "type": "above", "a": "rela-g@current", "b": "softmax@current", "margin": 0},
            {"claim": "rela-g within 1", "type": "not_below", "a": "rela-g@current", "b": "softmax@current",
             "margin": -1},
            {"claim": "lower helps rela-g", "type": "above", "a": "rela-g@lower", "b": "rela-g@current", "margin": 0},
            {"claim": "lower keeps softmax", "type": "not_below", "a": "softmax@lower", "b": "softmax@current",
             "margin": 0}]}]}


class _Steps:
    n = 0

    def update(self, n=1):
        self.n += n


def test_comparative_claims_need_three_seeds(tmp_path):
    records = _matrix(tmp_path)
    few = [r for r in records if not (r["spec"]["preset"] == "rela-g" and r["spec"]["seed"] > 1)]
    seed_cmp = SeedComparisons(tmp_path, 200)

    def row(records):
        _, rows = claims_section(records, {}, None, seed_cmp)
        return next(r for r in rows if r["claim"].startswith("ReLA-g translates about as well"))

    r = row(few)
    assert r["verdict"] == "not enough seeds" and r["explanation"] is None
    assert [s["verdict"] for s in r["seen"]] == ["not enough seeds (n=1)"] and r["seen"][0]["holds"] is None
    assert "(3+ seeds of each)" in r["criterion"]
    r = row(records)
    assert r["verdict"] == "disagrees" and r["seen"][0]["verdict"] == "does not hold"
    counted = SeedComparisons(tmp_path, 200, progress=(bar := _Steps()))  # the report's progress bar: one step a
    _, rows = claims_section(records, {}, None, counted)                     # comparison computed, none for a repeat
    assert bar.n == len(counted.done) > 0
    claims_section(records, {}, None, counted)
    assert bar.n == len(counted.done)
    assert "seeds 3 / 4" in r["seen"][0]["observed"] and r["explanation"]  # softmax: seeds 1, 2, 3 and 7
    md, rows = claims_section(records, {}, None, seed_cmp, experiment_ids=["recipe"])
    assert "[Recipe sensitivity: `recipe`](#experiment-recipe)" in "\n".join(md)
    sparse = next(r for r in rows if r["claim"].startswith("ReLA-g's attention is sparse"))
    assert sparse["seen"][0]["observed"].endswith("(mean over seeds 1, 2, 3)")


def test_experiment_rules_met_not_met_not_enough_seeds_not_run(tmp_path):
    md, (data,) = experiments_section(EXPERIMENTS, _matrix(tmp_path), SeedComparisons(tmp_path, 200), 200)
    assert [r["verdict"] for r in data["rules"]] == ["met", "not met", "not met", "not enough seeds (n=1)",
                                                      "not run yet"]
    text = "\n".join(md)
    assert "committed before any of their runs" in text and "### Peak learning rate (`recipe`)" in text
    assert "| `softmax@lower` | not run yet |" in text and "| `softmax@current` | 1, 2, 3 |" in text  # not seed 7
    assert data["cells"][2]["seeds"] == [1] and data["cells"][1]["vs_first"]["ci"][1] < 0
    assert "`rela-g@current` - `softmax@current` | interval below 0 |" in text


@pytest.mark.parametrize("change, message", [
    (lambda e: e["experiments"][0]["cells"].append("gmm@nowhere"), "not PRESET@ARM"),
    (lambda e: e["experiments"][0]["rules"][0].update(type="beyond"), "needs a claim, a type"),
    (lambda e: e["experiments"][0]["show"].append("entropy.nowhere"), "show 'entropy.nowhere'"),
    (lambda e: e.pop("seeds"), '"seeds" must be a list')])
def test_bad_experiments_file_is_one_error_line(tmp_path, change, message):
    spec = copy.deepcopy(EXPERIMENTS)
    change(spec)
    (tmp_path / "experiments.json").write_text(json.dumps(spec))
    with pytest.raises(HfAttnInputError, match=message):
        load_experiments(tmp_path)


def test_relative_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cmd = (f"hf-attn reproduce --output_dir {tmp_path / 'results'} --runs_dir /elsewhere/hf-attn-runs/runs "
           f"--readme=README.md --report_only -- --train_file={tmp_path}/data/train.jsonl")
    assert relative_command(cmd) == ("hf-attn reproduce --output_dir results --runs_dir .../runs "
                                         "--readme=README.md --report_only -- --train_file=data/train.jsonl")


def figures_built_not_rendered(monkeypatch) -> None:
    """From now until the test ends, the report's figures are built (every plot function runs) but not laid out and
    written: for a report written again only to read its text, whose figures an earlier report of the test rendered
    (its PNGs stay). Laying out and writing the figures is most of a report's time (matplotlib)."""
    from hf_attn.analysis.common import pyplot
    from hf_attn.report import plots

    def close(fig, path, title=""):
        pyplot().close(fig)
        return path

    monkeypatch.setattr(plots, "save_figure", close)


def test_report_across_seeds_and_experiments(tmp_path, monkeypatch):
    out = tmp_path / "results"
    _matrix(out, write=True)
    (out / "experiments.json").write_text(json.dumps(EXPERIMENTS))
    monkeypatch.chdir(tmp_path)
    command = f"hf-attn reproduce --output_dir {out} --runs_dir /root/hf-attn-runs/runs --report_only"
    text = rep.write_report(out, 100, command).read_text()
    first = (out / "REPORT.md").read_bytes(), (out / "report.json").read_bytes()
    figures_built_not_rendered(monkeypatch)  # the same figures again: the first report rendered them
    rep.write_report(out, 100, command)
    assert ((out / "REPORT.md").read_bytes(), (out / "report.json").read_bytes()) == first  # byte-identical
    assert "Last command: `hf-attn reproduce --output_dir results --runs_dir .../runs --report_only`" in text
    assert "/root/" not in text and str(tmp_path) not in text
    assert "## Across seeds: de->en, 600 steps, marian" in text and "## Recipe sensitivity" in text
    assert "| softmax | 1, 2, 3, 7 |" in text and "| BP |" in text
    line = next(x for x in text.splitlines() if x.startswith("| rela-g | 1, 2, 3 |"))
    assert "< 0.001" in line and "not enough seeds" not in line
    assert "words (" in text and (out / "plots" / "length_de-en_600steps.png").is_file()
    assert "ΔBLEU vs softmax, same seed" in text and "Per-seed detail" in text
    summary = json.loads(first[1])
    assert summary["experiments"][0]["rules"][0]["verdict"] == "met"
    assert summary["across_seeds"]["de-en_600steps"]["presets"]["rela-g"]["vs_softmax"]["bleu"]["n_a"] == 3
