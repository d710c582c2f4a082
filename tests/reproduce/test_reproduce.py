"""`hf-attn reproduce` end to end on a tiny matrix: runs, skip/resume, significance, claims, plots, README block and paper pages.

The matrices here, and their runs, run in the test's process (`reproduce.in_process`): the runs as child processes
are tested in tests/training/test_preemption.py, tests/reproduce/test_shared_runs_dir.py and the converged slot."""

from __future__ import annotations

import json
import math

import pytest
from conftest import PAD, tiny_batch
from reproduce.in_process import reproduce_in_process, runs_in_this_process
from reproduce.test_seeds import figures_built_not_rendered
from training_helpers import TINY_ARGS, bible_pairs, cli_in_process, write_jsonl

from hf_attn.docgen.pages import PAPERS
from hf_attn.plans.matrix import RunSpec, matrix
from hf_attn.report import report as rep
from hf_attn.report.paper_pages import BLOCK_END as PAGE_END, BLOCK_START as PAGE_START
from hf_attn.report.readme import _with_paper_column, by_paper, readme_groups
from hf_attn.report.tables import machine_lines, paired_bootstrap
from hf_attn.reproduce.runner import variant_figures

pytestmark = pytest.mark.slow

# a tiny model on a small parallel file: the matrix takes seconds per run
FLAGS = [*TINY_ARGS, "--eval_steps", "2", "--save_steps", "2"]


@pytest.fixture(scope="module")
def data_flags(tmp_path_factory):
    """The data flags of the module's matrices: 160 training pairs and 12 test pairs, written once."""
    d = tmp_path_factory.mktemp("data")
    train = write_jsonl(d / "train.jsonl", bible_pairs(160))
    test = write_jsonl(d / "test.jsonl", bible_pairs(12, "test"))
    return ["--train_file", str(train), "--validation_file", str(test), "--test_file", str(test)]


def test_matrix_order_and_names():
    specs = matrix(["rela-g", "softmax"], ["de-en", "ru-en"], [600], [42, 43])
    assert [s.preset for s in specs[:2]] == ["softmax", "rela-g"]  # softmax first in each setup: the baseline
    assert len({s.name for s in specs}) == 8
    assert specs[0].name == "de-en_600steps_seed42_softmax"
    assert RunSpec("softmax", "de", "en", 6, 1, "bart", ("--d_model", "32")).name.startswith("bart_de-en_6steps_seed1_x")


@pytest.mark.parametrize("train_args", [
    (),
    ("--max-predict-samples=8", "--test_file", "t.jsonl", "--max_predict_samples", "5", "--resume", "--d_model", "64"),
    ("--dataset", "dir", "--dataset-config-name", "de-en", "--corpus=bible", "--validation_file=v.jsonl"),
])
def test_the_test_split_is_read_from_the_data_flags_as_the_train_parser_reads_them(tmp_path, train_args):
    """records.data_arguments reads a run's pair and data flags without a parser: the values `hf-attn train`'s parser
    gives them (the last of a repeated flag wins, dashes or underscores, `HfAttnArguments`' types and defaults)."""
    from hf_attn.cli.train_args import parse_train_args
    from hf_attn.errors import HfAttnInputError
    from hf_attn.report.records import data_arguments

    argv = RunSpec("rela-g", "de", "en", 10, 42, "marian", train_args).train_argv(tmp_path / "run", False)
    hargs = parse_train_args(argv)[0]
    assert data_arguments(argv) == {name: getattr(hargs, name) for name in data_arguments(argv)}
    assert set(data_arguments(argv)) == {"source", "target", "corpus", "train_file", "validation_file", "test_file",
                                         "dataset", "dataset_config_name", "max_predict_samples"}
    with pytest.raises(HfAttnInputError, match="--max_predict_samples 'x': need int"):
        data_arguments([*argv, "--max_predict_samples", "x"])


def test_the_data_flags_are_declared_as_the_train_arguments_declare_them():
    """data/arguments.py declares the data flags below training, so that the report reads them without importing
    training: each is a field of `HfAttnArguments` of that type (or None), defaulting to None."""
    import dataclasses
    import typing

    from hf_attn.data.arguments import DATA_ARGUMENTS
    from hf_attn.training.args import HfAttnArguments

    fields = {f.name: f for f in dataclasses.fields(HfAttnArguments)}
    hints = typing.get_type_hints(HfAttnArguments)
    for name, kind in DATA_ARGUMENTS.items():
        assert fields[name].default is None and hints[name] == typing.Optional[kind], name


def test_reproduce_options_hold_the_parsers_defaults():
    from hf_attn.cli.reproduce import parse_reproduce_args
    from hf_attn.reproduce.runner import ReproduceOptions

    assert parse_reproduce_args([]) == (ReproduceOptions(), [])
    options, train_args = parse_reproduce_args(["--jobs", "2", "--report-only", "--runs_dir", "r", "--", "--d_model", "64"])
    assert options == ReproduceOptions(jobs=2, report_only=True, runs_dir="r") and train_args == ["--d_model", "64"]


def test_reproduce_end_to_end(tmp_path, data_flags, capsys, monkeypatch):
    out, runs = tmp_path / "results", tmp_path / "runs"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- reproduce-headline:start -->\nold\n<!-- reproduce-headline:end -->\ntail\n")
    docs = tmp_path / "docs"
    (docs / "papers").mkdir(parents=True)
    for page, _ in PAPERS.values():
        (docs / "papers" / f"{page}.md").write_text(f"# {page}\n{PAGE_START}\nold\n{PAGE_END}\ntail\n")
    args = ["reproduce", "--presets", "softmax,rela-g", "--pairs", "de-en", "--steps", "4", "--seeds", "1",
            "--output_dir", str(out), "--runs_dir", str(runs), "--sentences", "4", "--bootstrap", "100",
            "--threads", "1", "--readme", str(readme), "--docs", str(docs), "--", *FLAGS, *data_flags]
    runs_in_this_process(monkeypatch)
    code, _, err = reproduce_in_process(args, capsys, monkeypatch)
    assert code == 0, err[-3000:]
    names = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert len(names) == 2 and all(n.startswith("de-en_4steps_seed1_x") for n in names)
    rec = json.loads((out / "runs" / names[0]).read_text())
    assert rec["status"] == "complete" and rec["results"]["train_steps"] == 4
    assert set(rec["analysis"]["probe"]) == {"loss_true", "loss_shuffled", "gap", "sentences"}
    assert set(rec["analysis"]["attention"]["sites"]) == {"encoder", "decoder", "cross"}
    assert rec["results"]["curves"]["validation_loss"][0][0] == 2  # the validation loss every --eval_steps
    assert rec["results"]["recipe"] and rec["results"]["model_config"]["activation_function"] == "relu"
    summary = json.loads((out / "report.json").read_text())
    (name, sig), = summary["significance"].items()
    assert "rela-g" in name
    for metric in ("bleu", "chrf"):
        s = sig[metric]
        assert s["ci"][0] <= s["delta"] + 1e-6 and s["delta"] <= s["ci"][1] + 1e-6 and 0 <= s["p_value"] <= 1
    text = (out / "REPORT.md").read_text()
    assert "ΔBLEU vs softmax" in text and "What the papers claim" in text and "| rela-g |" in text
    assert "ReLA-g translates about as well as softmax" in text and "not enough seeds (n=1)" in text
    assert "## Across seeds: de->en, 4 steps, marian, flags" in text
    command = next(line for line in text.splitlines() if line.startswith("Last command:"))
    assert str(tmp_path) not in command and "--output_dir" in command
    pngs = sorted(p.name for p in (out / "plots").glob("*.png"))
    assert any(p.startswith("scores_") for p in pngs) and any(p.startswith("validation_") for p in pngs)
    assert any(p.startswith("attention_") for p in pngs) and any(p.startswith("length_") for p in pngs)
    assert "old" not in readme.read_text() and "no group of runs with 3 seeds" in readme.read_text()
    assert readme.read_text().endswith("tail\n")
    rela = (docs / "papers" / "rela.md").read_text()  # the paper pages' measured results, from report.json
    assert "old" not in rela and rela.endswith(f"{PAGE_END}\ntail\n")
    assert "| ReLA-g translates about as well as softmax" in rela and "| group | preset |" not in rela  # runs with flags

    # again: both records exist, nothing is trained (the run directories may even be gone)
    import shutil

    shutil.rmtree(runs)
    figures_built_not_rendered(monkeypatch)  # the same report again: the first call rendered its figures
    code, out2, err = reproduce_in_process(args, capsys, monkeypatch)
    assert code == 0, err[-2000:]
    assert "2 already recorded, 0 to run" in out2
    assert not runs.exists() or not any(runs.iterdir())


def test_reproduce_resumes_a_partial_run(tmp_path, data_flags, capsys, monkeypatch):
    """A run killed after its first checkpoint is resumed by the next `reproduce`, not restarted."""
    out, runs = tmp_path / "results", tmp_path / "runs"
    spec = RunSpec("softmax", "de", "en", 4, 1, "marian", tuple(FLAGS + data_flags))
    # a partial run: train 2 of the 4 steps into the run directory, as a killed run would leave it
    partial = spec.train_argv(runs / spec.name, False)
    partial[partial.index("--max_steps") + 1] = "2"
    runs_in_this_process(monkeypatch)
    code, _, err = reproduce_in_process(["train", *partial], capsys, monkeypatch)
    assert code == 0, err[-2000:]
    (runs / spec.name / "results.json").unlink()  # killed before the end of the run
    code, stdout, err = reproduce_in_process(
        ["reproduce", "--presets", "softmax", "--pairs", "de-en", "--steps", "4", "--seeds", "1", "--output_dir",
         str(out), "--runs_dir", str(runs), "--sentences", "4", "--bootstrap", "100", "--", *FLAGS, *data_flags],
        capsys, monkeypatch)
    assert code == 0, err[-2000:]
    assert "resuming " + spec.name in stdout
    log = (runs / f"{spec.name}.log").read_text()
    assert "resuming from" in log and "checkpoint-2" in log
    rec = json.loads((out / "runs" / f"{spec.name}.json").read_text())
    assert rec["results"]["train_steps"] == 4


def test_failed_run_is_recorded_and_reported(tmp_path):
    """A diverged run (the papers' "does not converge") is a row of the report, not a crash of it."""
    out = tmp_path / "results"
    (out / "runs").mkdir(parents=True)
    spec = RunSpec("relu", "de", "en", 4, 1)
    (out / "runs" / f"{spec.name}.json").write_text(json.dumps({
        "version": 1, "name": spec.name, "setup": spec.setup, "spec": spec.__dict__ | {"train_args": []},
        "status": "failed", "error": "training diverged (loss nan) at step 3"}))
    path = rep.write_report(out, n_samples=100)
    text = path.read_text()
    assert "failed: training diverged" in text
    assert "ReLU alone, without normalisation, fails to train" in text


def test_paired_bootstrap_known_answers():
    refs = ["the cat sat on the mat", "a dog ran in the park", "we eat bread"] * 10
    same = paired_bootstrap(refs, refs, refs, n_samples=100)
    assert same["bleu"]["delta"] == 0 and same["bleu"]["ci"] == [0, 0]
    worse = ["the cat", "a dog", "bread"] * 10
    s = paired_bootstrap(refs, worse, refs, n_samples=100)
    assert s["bleu"]["delta"] < -50 and s["bleu"]["ci"][1] < 0 and s["bleu"]["p_value"] < 0.05
    assert math.isfinite(s["chrf"]["delta"])
    with pytest.raises(ValueError):
        paired_bootstrap(refs, refs[:-1], refs)


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    code, err = cli_in_process(["reproduce", "--presets", "softmx", "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and "did you mean 'softmax'" in err and err.count("\n") == 1
    code, err = cli_in_process(["reproduce", "--pairs", "deen", "--output_dir", str(tmp_path)], capsys)
    assert code == 2 and "SOURCE-TARGET" in err
    code, err = cli_in_process(["reproduce", "--output_dir", str(tmp_path), "--", "--preset", "relu"], capsys)
    assert code == 2 and "--presets" in err


def test_claim_texts_fit_a_markdown_table():
    from hf_attn.report.claims import CLAIMS

    for c in CLAIMS:
        assert "|" not in c.claim + c.criterion + c.explanation, c.claim


def test_budget_trend_traces_the_gap_over_budgets():
    from hf_attn.report.claims import budget_trend

    def record(preset, steps, seed=42):
        spec = {"preset": preset, "source": "de", "target": "en", "steps": steps, "seed": seed, "base": "marian"}
        return {"name": f"de-en_{steps}steps_seed{seed}_{preset}", "spec": spec}

    def bleu(delta, lo, hi):
        return {"bleu": {"delta": delta, "ci": [lo, hi], "p_value": 0.001}}

    records = [record("rela-g", 600), record("rela-g", 1800), record("rela-g", 600, seed=43), record("softmax", 600)]
    sig = {"de-en_600steps_seed42_rela-g": bleu(-3.6, -4.2, -3.1), "de-en_1800steps_seed42_rela-g": bleu(-4.0, -4.7, -3.3),
           "de-en_600steps_seed43_rela-g": bleu(-1.0, -1.5, -0.5)}
    text = budget_trend(records, sig, "rela-g")
    assert "-3.6 [-4.2, -3.1] at 600 steps, -4.0 [-4.7, -3.3] at 1,800 steps" in text
    assert "3x the steps the gap held" in text and "seed 43" not in text  # one budget only: no trend
    sig["de-en_1800steps_seed42_rela-g"] = bleu(-1.0, -1.6, -0.4)
    assert "gap narrowed" in budget_trend(records, sig, "rela-g")
    sig["de-en_1800steps_seed42_rela-g"] = bleu(-6.0, -6.6, -5.4)
    assert "gap widened" in budget_trend(records, sig, "rela-g")
    sig["de-en_600steps_seed42_rela-g"] = bleu(0.2, -0.4, 0.7)  # calibration-gate's: +0.2 at 600, -1.0 at 1,800
    sig["de-en_1800steps_seed42_rela-g"] = bleu(-1.0, -1.7, -0.2)
    assert "gap reversed (changed sign and grew)" in budget_trend(records, sig, "rela-g")
    sig["de-en_1800steps_seed42_rela-g"] = bleu(-0.1, -0.6, 0.4)
    assert "gap held" in budget_trend(records, sig, "rela-g")
    assert budget_trend(records, sig, "gmm") == ""


def test_reproduce_with_bart_on_files(tmp_path, data_flags, capsys, monkeypatch):
    """The matrix runs BART too (and data files, given after --); the record says which base it trained."""
    out, runs = tmp_path / "results", tmp_path / "runs"
    runs_in_this_process(monkeypatch)
    code, _, err = reproduce_in_process(
        ["reproduce", "--presets", "softmax", "--pairs", "de-en", "--steps", "2", "--seeds", "1", "--base", "bart",
         "--output_dir", str(out), "--runs_dir", str(runs), "--sentences", "4", "--bootstrap", "100", "--", *FLAGS,
         *data_flags], capsys, monkeypatch)
    assert code == 0, err[-2000:]
    (path,) = (out / "runs").glob("*.json")
    assert path.name.startswith("bart_de-en_2steps_seed1_")
    rec = json.loads(path.read_text())
    assert rec["results"]["base"] == "bart" and rec["results"]["model_class"].endswith("BartForConditionalGeneration")
    assert "## de->en, 2 steps, seed 1, bart" in (out / "REPORT.md").read_text()


class _Tokenizer:
    """Enough of a tokenizer for `variant_figures`: tiny_batch's ids for every call, padded with PAD."""

    pad_token_id = PAD

    def __call__(self, sources, text_target, **kwargs):
        batch = tiny_batch(batch=len(sources))
        return {**batch, "labels": batch["labels"].masked_fill(batch["labels"] == -100, PAD)}


@pytest.mark.parametrize("preset", ["gmm", "gmm-only", "gmm-average", "calibration-gate", "softmax"])
def test_variant_figures_for_every_fusion(preset):
    """A run's analysis gives the gate per layer where the model has one, and no error where it has none
    (gmm-only, gmm-average: the matrix's gmm-only run once stopped there, after training)."""
    from conftest import tiny_model

    out = variant_figures(tiny_model("marian", preset), _Tokenizer(), ["a"] * 3, ["b"] * 3)
    assert ("gmm_gate" in out) == (preset == "gmm")
    assert ("calibration_mask" in out) == (preset == "calibration-gate")
    if preset == "gmm":
        assert all(0 < g < 1 for g in out["gmm_gate"].values())


def test_reluformer_ablation_claims_judge_bleu_and_entropy():
    """Table 5's '- reg loss' row as two claims: BLEU lower (seed-aware interval below 0), and entropy lower at every
    site."""
    from hf_attn.report.claims import _entropy_falls, _lower_bleu

    def run(entropy):
        sites = {s: {"entropy": entropy, "null_rate": 0.5} for s in ("encoder", "decoder", "cross")}
        return {"status": "complete", "analysis": {"attention": {"sites": sites}}}

    lower = _lower_bleu("reluformer-no-reg", "reluformer")
    assert (lower.a, lower.b) == ("reluformer-no-reg", "reluformer")
    assert lower.holds(-4.7, [-5.4, -4.0]) and not lower.holds(-0.7, [-1.6, 0.2])  # the second: within the spread
    runs = {"reluformer": run(0.5), "reluformer-no-reg": run(2.0)}
    holds, seen = _entropy_falls("reluformer-no-reg", "reluformer")(runs)
    assert not holds and "null rows 50%" in seen
    runs = {"reluformer": run(2.0), "reluformer-no-reg": run(0.5)}
    assert _entropy_falls("reluformer-no-reg", "reluformer")(runs)[0]


def test_machine_lines_name_the_runs_of_each_setup():
    def rec(name, device):
        return {"name": name, "results": {"device": device}}

    assert machine_lines([rec("a", "CPU"), rec("b", "CPU"), {"name": "c"}]) == ["- CPU: all runs"]
    assert machine_lines([rec("b", "CPU, kept"), rec("a", "CPU"), rec("c", "CPU")]) == ["- CPU: a, c",
                                                                                            "- CPU, kept: b"]


def test_loss_gap_says_where_the_validation_losses_part():
    from hf_attn.report.claims import loss_gap

    def record(preset, steps, curve):
        spec = {"preset": preset, "source": "de", "target": "en", "steps": steps, "seed": 42, "base": "marian"}
        return {"spec": spec, "results": {"curves": {"validation_loss": [[100 * (i + 1), v] for i, v in enumerate(curve)]}}}

    soft = [6.7, 6.4, 5.7, 5.3, 4.7, 4.5]
    records = [record("softmax", 600, soft), record("rela-g", 600, [6.6, 6.5, 5.6, 5.4, 4.9, 4.6]),
               record("rela-g", 1800, [7.0, 7.0, 7.0])]  # no softmax run of 1,800 steps: not used
    text = loss_gap(records, "rela-g")
    assert text == ("Validation loss of `rela-g` minus softmax's (de-en, seed 42, marian, 600 steps): -0.10 at step 100; "
                    "it stays above softmax's from step 400 on; largest +0.20 (step 500), +0.10 at step 600.")
    records[1] = record("rela-g", 600, [v - 0.1 for v in soft])
    assert "does not stay above softmax's" in loss_gap(records, "rela-g")
    records[1] = record("rela-g", 600, [v + 0.1 * i for i, v in enumerate(soft)])
    assert loss_gap(records, "rela-g").endswith("from step 200 on; largest at the end, +0.50 at step 600.")
    assert loss_gap(records, "gmm") == ""


def test_decoding_speed_claim_is_judged_on_the_benchmark(tmp_path):
    """RAN's speed claim reads `scripts/benchmark.py`'s interleaved ratios (results/benchmark/*.json), not the test
    decoding speed of two runs timed beside other work; --long results are not sentence-level and are left out,
    --compile results (every model compiled) too, and JSON that is no benchmark result (the GMM budget's)."""
    from hf_attn.bench.results import BenchmarkResult, BenchSettings, CallTiming, LongRow, SentenceRow
    from hf_attn.report.claims import claims_section

    def sentence_row(preset, vs_stock, vs_softmax, share=None):
        decode = CallTiming(0.5, vs_stock, vs_softmax, attention_share=share)
        return SentenceRow(preset, {"train": CallTiming(1.0, 1.0, 1.0), "decode": decode}, params=100)

    def bench(ran_all, long=None, compile=None):
        settings = BenchSettings(presets=("softmax", "ran-all", "ran-d"), beams=4, decode_batch=16, decode_len=24,
                                 repeats=9, long=long, compile=compile, no_memory=True)
        rows = (sentence_row("stock-sdpa", 1.0, 1.01, share=0.09), sentence_row("ran-all", ran_all, ran_all + 0.06),
                sentence_row("ran-d", 1.04, 1.13))
        long_rows = tuple(LongRow(n, "ran-all", CallTiming(1.0, ran_all, 1.0), 10.0, None) for n in long or ())
        result = BenchmarkResult(settings, "python scripts/benchmark.py", "2", "CPU", rows=() if long else rows,
                                 long_rows=long_rows, times={})
        return result.to_json()

    (tmp_path / "benchmark").mkdir()
    for name, result in {"marian.json": bench(1.02), "bart.json": bench(1.21), "long.json": bench(2.0, (512,)),
                         "marian_compiled.json": bench(1.5, compile="inductor")}.items():
        (tmp_path / "benchmark" / name).write_text(json.dumps(result))
    (tmp_path / "benchmark" / "marian.md").write_text("| table |")
    (tmp_path / "benchmark" / "gmm_budget.json").write_text(json.dumps({"settings": {"preset": "gmm"}, "train": {}}))
    benchmarks = rep.load_benchmarks(tmp_path)
    assert sorted(benchmarks) == ["benchmark/bart.json", "benchmark/marian.json"]
    md, rows = claims_section([], {}, benchmarks)
    (row,) = [r for r in rows if r["claim"].startswith("RAN-ALL decodes faster")]
    assert row["verdict"] == "mixed" and [s["holds"] for s in row["seen"]] == [True, False]
    assert row["seen"][1]["observed"].startswith("`ran-all` 1.02x, `ran-d` 1.04x stock SDPA's decoding speed "
                                                 "(1.08x / 1.13x hf-attn softmax's)")
    assert "stock spends 9% of a decoding call in SDPA" in row["seen"][1]["observed"] and row["explanation"]
    _, rows = claims_section([], {}, {})
    assert next(r for r in rows if r["claim"].startswith("RAN-ALL"))["verdict"] == "not measured yet"


def test_readme_quotes_the_adopted_recipes_groups_with_enough_seeds():
    def rec(preset, steps, seed=42, source="de", flags=(), status="complete"):
        spec = {"preset": preset, "source": source, "target": "en", "steps": steps, "seed": seed, "base": "marian",
                "train_args": list(flags)}
        return {"name": f"{source}-{steps}-{seed}-{preset}-{len(flags)}", "status": status, "spec": spec,
                "hypotheses": ["x"]}

    three = [rec(p, n, seed) for p in ("softmax", "rela-g") for n in (600, 1800) for seed in (42, 43, 44)]
    assert readme_groups(three) == [("marian", "de", "en", 1800, ()), ("marian", "de", "en", 600, ())]
    flagged = [rec(p, 600, seed, flags=("--x", "1")) for p in ("softmax", "gmm") for seed in (42, 43, 44)]
    short = [rec("softmax", 900, seed) for seed in (42, 43, 44)] + [rec("gmm", 900, 42), rec("gmm", 900, 43)]
    assert readme_groups(flagged + short) == []  # an experiment's arm; a second preset with 2 seeds
    assert readme_groups([]) == []


def test_readme_tables_group_presets_by_paper():
    rows = by_paper(["ran-d", "reluformer-no-reg", "rela-g", "gmm", "softmax", "reluformer", "relu", "calibration-gate"])
    assert rows == [("", "softmax"), ("ReLA", "rela-g"), ("ReLA", "relu"), ("GMM", "gmm"),
                    ("ReLUFormer", "reluformer"), ("ReLUFormer", "reluformer-no-reg"), ("RAN", "ran-d"),
                    ("Calibration", "calibration-gate")]
    table = ["| preset | BLEU |", "|---|---|", "| softmax | 1 |", "| rela-g | 2 |", "| relu | 3 |", "| gmm | 4 |"]
    assert _with_paper_column(table, ["", "ReLA", "ReLA", "GMM"]) == [
        "| paper | preset | BLEU |", "|---|---|---|", "|  | softmax | 1 |", "| ReLA | rela-g | 2 |", "|  | relu | 3 |",
        "| GMM | gmm | 4 |"]


def test_the_report_says_which_runs_trained_compiled():
    eager = {"name": "de-en_600steps_seed42_softmax", "results": {"training": {"seed": 42}}}
    compiled = {"name": "de-en_600steps_seed43_softmax", "results": {"training": {"torch_compile": True}}}
    failed = {"name": "de-en_600steps_seed44_relu", "status": "failed"}
    assert rep.compiled_line([eager, failed]).startswith("Every run trained eagerly")
    line = rep.compiled_line([eager, compiled, failed])
    assert line.startswith("1 of 2 runs trained compiled") and "`de-en_600steps_seed43_softmax`" in line
    assert "seed42" not in line


def _site_record(preset, seed, steps=600, entropy=1.0, null_rate=0.0, bleu=10.0, gap=1.0, flags=()):
    sites = {s: {"entropy": entropy, "null_rate": null_rate} for s in ("encoder", "decoder", "cross")}
    spec = {"preset": preset, "source": "de", "target": "en", "steps": steps, "seed": seed, "base": "marian",
            "train_args": list(flags)}
    return {"name": f"{preset}_{seed}_{steps}", "spec": spec, "status": "complete", "results": {"bleu": bleu},
            "analysis": {"attention": {"sites": sites}, "probe": {"gap": gap}}}


def test_per_seed_evidence_gives_each_seed_beside_the_reference():
    """A claim's explanation can carry per-seed figures computed from the runs: BLEU and entropy beside the
    reference's of the same seed (where there is one), null rows and the source probe, for the adopted recipe's
    group or for one arm's flags."""
    from hf_attn.report.claims import per_seed

    noclip = ("--max_grad_norm", "0")
    records = [_site_record("reluformer-no-reg", 42, entropy=2.1, null_rate=0.96, bleu=2.5, gap=-0.0004),
               _site_record("reluformer", 42, entropy=1.9, bleu=11.9),
               _site_record("reluformer-no-reg", 43, bleu=9.4),  # no reluformer run of seed 43
               _site_record("reluformer-no-reg", 42, bleu=0.1, flags=noclip)]
    text = per_seed("reluformer-no-reg", "reluformer")(records)
    assert text == ("Per seed, `reluformer-no-reg` against `reluformer` (de->en, 600 steps, marian): seed 42: BLEU 2.5 "
                    "vs 11.9, entropy encoder 2.10 vs 1.90, decoder 2.10 vs 1.90, cross 2.10 vs 1.90 nats, null rows "
                    "encoder 96%, decoder 96%, cross 96%, source probe +0.00; seed 43: BLEU 9.4, entropy encoder 1.00, "
                    "decoder 1.00, cross 1.00 nats, null rows encoder 0%, decoder 0%, cross 0%, source probe +1.00.")
    arm = per_seed("reluformer-no-reg", "reluformer", train_args=noclip)(records)
    assert arm.startswith("Per seed, `reluformer-no-reg` (de->en, 600 steps, marian, flags `--max_grad_norm 0`): "
                          "seed 42: BLEU 0.1, entropy encoder 1.00,") and "seed 43" not in arm
    assert per_seed("gmm", "softmax")(records) == ""


def test_gap_by_group_splits_the_bleu_gap_into_brevity_and_precision():
    """Per group with enough seeds shared with the reference (an arm's runs against the adopted recipe's reference of
    the same budget): mean ΔBLEU, each one's BP, and the difference of BLEU / BP; groups in (pair, budget) order."""
    from hf_attn.report.claims import gap_by_group

    def rec(preset, seed, steps, bleu, bp, flags=()):
        r = _site_record(preset, seed, steps, bleu=bleu, flags=flags)
        r["results"]["bleu_details"] = {"bp": bp}
        return r

    gate = ("--gmm_gate_init", "0.1")
    records = ([rec("softmax", s, n, 20.0, 0.8) for s in (42, 43, 44) for n in (600, 1800)] +
               [rec("gmm", s, 1800, 19.0, 0.8) for s in (42, 43, 44)] +
               [rec("gmm", s, 600, 16.0, 0.64, gate) for s in (42, 43, 44)] +
               [rec("gmm", s, 600, 1.0, 0.5) for s in (42, 43)])  # two seeds: left out
    text = gap_by_group("gmm", arms=((), gate))(records)
    assert text == ("`gmm` against `softmax` group by group (means over the seeds both have): de->en, 600 steps, "
                    "marian, flags `--gmm_gate_init 0.1`, seeds 42, 43, 44: ΔBLEU -4.0, BP 0.640 vs 0.800, precision "
                    "part (BLEU / BP) +0.0; de->en, 1800 steps, marian, seeds 42, 43, 44: ΔBLEU -1.0, BP 0.800 vs "
                    "0.800, precision part (BLEU / BP) -1.2.")
    assert gap_by_group("gmm")(records).count("seeds 42, 43, 44") == 1  # the arm only when asked for
    assert gap_by_group("ran-d")(records) == ""


def test_validation_plot_averages_seeds_per_budget_and_leaves_arms_out(tmp_path, monkeypatch):
    from hf_attn.report import plots

    def rec(preset, seed, steps, flags=()):
        r = _site_record(preset, seed, steps, flags=flags)
        r["results"]["curves"] = {"validation_loss": [[n, 7.0 - n / 1000 - seed / 100] for n in range(100, steps + 1, 100)]}
        return r

    seen = {}

    def capture(fig, path, title=""):
        seen[path.name] = [(ax.get_title(), [(line.get_label(), list(line.get_ydata())) for line in ax.get_lines()])
                           for ax in fig.axes]
        return path

    records = [rec(p, s, n) for p in ("softmax", "gmm") for s in (42, 43) for n in (600, 1800)]
    records.append(rec("gmm", 42, 900, flags=("--gmm_gate_init", "0.5")))  # an arm: no panel of its own
    monkeypatch.setattr(plots, "save_figure", capture)
    plots.plot_validation_curves(records, tmp_path / "v.png", "Validation loss")
    panels = seen["v.png"]
    assert [title for title, _ in panels] == ["600 steps", "1,800 steps"]
    lines = dict(panels[0][1])
    assert list(lines) == ["softmax (2 seeds)", "gmm (2 seeds)"]
    assert lines["softmax (2 seeds)"][0] == pytest.approx(7.0 - 0.1 - 0.425)  # mean over seeds 42 and 43 at step 100
    plots.plot_validation_curves([], tmp_path / "none.png", "x")
    assert [title for title, _ in seen["none.png"]] == ["no curves"]


def test_site_by_budget_evidence_needs_enough_shared_seeds_at_two_budgets():
    from hf_attn.report.claims import site_by_budget

    records = [_site_record(p, seed, steps, entropy=e)
               for steps, (mine, ref) in ((600, (1.9, 1.8)), (1800, (1.5, 1.7)))
               for p, e in (("reluformer", mine), ("softmax", ref)) for seed in (42, 43, 44)]
    text = site_by_budget("reluformer")(records)
    assert text == ("Entropy of `reluformer` against `softmax` by budget (de->en, marian; mean over the seeds both have): "
                    "600 steps encoder 1.90 vs 1.80, decoder 1.90 vs 1.80, cross 1.90 vs 1.80 (seeds 42, 43, 44); "
                    "1,800 steps encoder 1.50 vs 1.70, decoder 1.50 vs 1.70, cross 1.50 vs 1.70 (seeds 42, 43, 44).")
    fewer = [r for r in records if not (r["spec"]["steps"] == 1800 and r["spec"]["seed"] == 44)]
    assert site_by_budget("reluformer")(fewer) == ""  # 1,800 steps with 2 seeds: one budget left, no comparison
