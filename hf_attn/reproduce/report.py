"""The reproduction report: ``REPORT.md``, ``report.json`` and PNG plots, rebuilt from the run records alone.

Every number in it comes from a record that `runner.run_one` wrote (``runs/<name>.json`` and the test translations
beside it); nothing is typed by hand. Significance is seed-aware: the runs of one configuration (base, pair, budget,
extra flags) with different seeds form a group, and each preset is compared with ``softmax`` of its group by
`seeds.seed_bootstrap` (test sentences and training seeds resampled together), with a verdict only where both have
at least 3 seeds. The per-seed sections compare the runs of one setup (pair, budget, seed, base, flags) by paired
bootstrap resampling (Koehn 2004) with sacrebleu's `PairedTest` (1,000 resamples, seed 12345): the detail of one
seed, blind to the variance between seeds. "Recipe sensitivity" judges the experiments of ``experiments.json``,
whose questions and rules were fixed before their runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from ..analysis.common import bucket_labels, bucket_of, pyplot, save_figure, words
from ..bench.results import BenchmarkResult, NotABenchmarkResult, load_result
from ..data import load_corpus
from ..errors import HfAttnInputError
from ..io_utils import dumps_strict, replace_marked_block
from ..modeling.hyperparameters import SITES
from ..training.args import parse_train_args
from .claims import claims_section, delta_ci
from .matrix import RunSpec
from .paper_pages import update_paper_pages
from .seeds import (
    MIN_SEEDS,
    complete,
    corpus_score,
    group_name,
    group_records,
    group_title,
    mean_sd,
    p_text,
    run_stats,
    scorer,
    seed_bootstrap,
    seed_delta,
)

STATS = ("sparsity", "null_rate", "entropy", "head_diversity")
LENGTH_EDGES = (10, 20, 30)  # source words; Bible verses (John) run 3-54 words, median 20, 12% over 30


# -------------------------------------------------------------------------------------------------- records
def load_records(output_dir: Path) -> list[dict]:
    out = []
    for path in sorted(Path(output_dir, "runs").glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        hyp = path.with_suffix(".hyp.txt")
        rec["hypotheses"] = hyp.read_text(encoding="utf-8").splitlines() if hyp.is_file() else None
        out.append(rec)
    return out


# the `hf-attn train` flags that choose the test split: runs that agree on these (and on the pair) share it
DATA_FLAGS = ("--corpus", "--train_file", "--validation_file", "--test_file", "--dataset", "--dataset_config_name",
              "--max_predict_samples")


def _flag(text: str) -> str:
    """``--max-predict-samples=8`` -> ``--max_predict_samples``."""
    return "--" + text[2:].split("=", 1)[0].replace("-", "_")


def test_data_name(record: dict) -> str:
    """The cache name of a record's test split: its pair, and a hash of the data flags it was given (if any), so that
    every seed, budget and recipe flag of one pair shares one file."""
    spec, args = record["spec"], list(record["spec"].get("train_args") or ())
    data = [f"{_flag(a)}={a.split('=', 1)[1] if '=' in a else args[i + 1]}" for i, a in enumerate(args)
            if a.startswith("--") and _flag(a) in DATA_FLAGS and ("=" in a or i + 1 < len(args))]
    extra = f"_x{hashlib.sha1(' '.join(data).encode()).hexdigest()[:6]}" if data else ""
    return f"{spec['source']}-{spec['target']}{extra}"


def _test_split(output_dir: Path, record: dict) -> tuple[list[str], list[str]]:
    """The test sources and references of a record's data, read from its data and cached in ``references/``."""
    spec = dict(record["spec"], train_args=tuple(record["spec"].get("train_args") or ()))
    hargs, _, _, _ = parse_train_args(RunSpec(**spec).train_argv(Path("unused"), False))
    corpus = load_corpus(hargs.corpus, hargs.source, hargs.target, hargs.train_file, hargs.validation_file,
                         hargs.test_file, hargs.dataset, hargs.dataset_config_name,
                         {"train": hargs.max_train_samples, "test": hargs.max_predict_samples})
    sources, refs = corpus.pairs("test")
    for suffix, lines in ((".src.txt", sources), (".txt", refs)):
        path = Path(output_dir, "references", test_data_name(record) + suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sources, refs


def _cached_split(output_dir: Path, record: dict, suffix: str, which: int) -> list[str]:
    path = Path(output_dir, "references", test_data_name(record) + suffix)
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()
    return _test_split(output_dir, record)[which]


def references_for(output_dir: Path, record: dict) -> list[str]:
    """The test references of a record's data, cached in ``references/<pair>.txt`` (`test_data_name`)."""
    return _cached_split(output_dir, record, ".txt", 1)


def sources_for(output_dir: Path, record: dict) -> list[str]:
    """The test sources of a record's data, cached in ``references/<pair>.src.txt`` (`test_data_name`)."""
    return _cached_split(output_dir, record, ".src.txt", 0)


def shared_references(output_dir: Path, records: list[dict]) -> list[str]:
    """The test references of ``records``, which are compared sentence by sentence and so must share them."""
    refs = references_for(output_dir, records[0])
    for r in records[1:]:
        if references_for(output_dir, r) != refs:
            raise HfAttnInputError(f"{r['name']} and {records[0]['name']} have different test references: runs are "
                                   "compared only on the same test set")
    return refs


def relative_command(command: str, cwd: str | None = None) -> str:
    """``command`` with each absolute path made relative to ``cwd`` (default: the current directory) when it lies
    under it, else cut to ``.../<its last part>``: the report names no machine's directories."""
    cwd = os.path.abspath(cwd or os.getcwd())
    return " ".join(_relative_token(t, cwd) for t in command.split(" "))


def _relative_token(token: str, cwd: str) -> str:
    flag, eq, value = token.partition("=") if token.startswith("-") and "=" in token else ("", "", token)
    if not os.path.isabs(value):
        return token
    value = os.path.normpath(value)
    inside = os.path.commonpath([cwd, value]) == cwd
    return flag + eq + (os.path.relpath(value, cwd) if inside else os.path.join("...", os.path.basename(value)))


# -------------------------------------------------------------------------------------------------- significance
def paired_bootstrap(baseline: list[str], system: list[str], references: list[str], n_samples: int = 1000) -> dict:
    """``{metric: {"delta", "ci": [lo, hi], "p_value", "system_ci", "baseline_ci"}}`` for BLEU and chrF.

    sacrebleu's `PairedTest` (test_type "bs") gives the p-value and each system's 95% interval; the interval of the
    difference is taken from the same resamples (sacrebleu's seed, its sufficient statistics)."""
    if not (len(baseline) == len(system) == len(references)):
        raise ValueError(f"paired bootstrap needs equal lengths: {len(baseline)}, {len(system)}, {len(references)}")
    metrics = {"BLEU": BLEU(), "chrF": CHRF()}
    test = PairedTest([("baseline", baseline), ("system", system)], metrics, [references], test_type="bs",
                      n_samples=n_samples)
    _, scores = test()
    idx = np.random.default_rng(test._seed).choice(len(system), size=(n_samples, len(system)), replace=True)
    out = {}
    result_keys = [k for k in scores if k != "System"]  # sacrebleu names them by signature ("chrF2")
    for (name, metric), key in zip(metrics.items(), result_keys):
        base_r, sys_r = scores[key]
        stats = [np.array(metric._extract_corpus_statistics(h, [references]), dtype="float32") for h in (baseline, system)]
        diffs = np.array([metric._compute_score_from_stats(stats[1][i].sum(0)).score -
                          metric._compute_score_from_stats(stats[0][i].sum(0)).score for i in idx])
        out[name.lower()] = {"baseline": round(base_r.score, 2), "system": round(sys_r.score, 2),
                             "delta": round(sys_r.score - base_r.score, 2),
                             "ci": [round(float(np.percentile(diffs, 2.5)), 2), round(float(np.percentile(diffs, 97.5)), 2)],
                             "p_value": round(float(sys_r.p_value), 4),
                             "system_ci": round(float(sys_r.ci), 2), "baseline_ci": round(float(base_r.ci), 2)}
    return out


# -------------------------------------------------------------------------------------------------- tables
def _setup_title(rec: dict) -> str:
    s = rec["spec"]
    extra = f", flags `{' '.join(s['train_args'])}`" if s.get("train_args") else ""
    return f"{s['source']}->{s['target']}, {s['steps']} steps, seed {s['seed']}, {s['base']}{extra}"


def _fmt(x, spec=".1f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def compare(output_dir: Path, records: list[dict], n_samples: int) -> dict:
    """``{name: paired_bootstrap(...)}`` of every complete record against softmax of its setup."""
    by_setup = defaultdict(dict)
    for r in records:
        by_setup[r["setup"]][r["spec"]["preset"]] = r
    out = {}
    for setup, runs in by_setup.items():
        base = runs.get("softmax")
        if not base or base["status"] != "complete":
            continue
        refs = references_for(output_dir, base)
        for preset, r in runs.items():
            if preset != "softmax" and r["status"] == "complete" and r.get("hypotheses"):
                out[r["name"]] = paired_bootstrap(base["hypotheses"], r["hypotheses"], refs, n_samples)
    return out


def headline_table(runs: list[dict], sig: dict) -> list[str]:
    """One setup's runs (one seed): scores, brevity penalty, the paired bootstrap against softmax of the same seed,
    losses, the source probe and speeds."""
    lines = ["| preset | BLEU | chrF | BP | ΔBLEU vs softmax, same seed [95% CI] | p | ΔchrF [95% CI] | val. loss | "
             "source probe: loss true / shuffled | train tok/s | decode sent/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r["spec"]["preset"]
        if r["status"] != "complete":
            lines.append(f"| {p} | failed: {r.get('error', r['status'])} | | | | | | | | | |")
            continue
        res, probe = r["results"], r["analysis"]["probe"]
        s = sig.get(r["name"])
        d = (delta_ci(s["bleu"]), f"{s['bleu']['p_value']:.3f}", delta_ci(s["chrf"])) if s else \
            ("(baseline)" if p == "softmax" else "no softmax run", "", "")
        lines.append(f"| {p} | {res['bleu']:.1f} | {res['chrf']:.1f} | {_fmt(show_value(r, 'bp'), '.3f')} | {d[0]} | "
                     f"{d[1]} | {d[2]} | {_fmt(res.get('validation_loss'), '.3f')} | "
                     f"{probe['loss_true']:.2f} / {probe['loss_shuffled']:.2f} | "
                     f"{_fmt(res.get('tokens_per_second'), '.0f')} | {_fmt(res.get('decode_sentences_per_second'), '.1f')} |")
    return lines


def attention_table(runs: list[dict]) -> list[str]:
    lines = ["| preset | site | sparsity | null rate | entropy (nats) | head diversity | top-10% mass |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        if r["status"] != "complete":
            continue
        sites = r["analysis"]["attention"]["sites"]
        for site in SITES:
            if site in sites:
                x = sites[site]
                lines.append(f"| {r['spec']['preset']} | {site} | {_fmt(x.get('sparsity'), '.3f')} | "
                             f"{_fmt(x.get('null_rate'), '.3f')} | {_fmt(x.get('entropy'), '.3f')} | "
                             f"{_fmt(x.get('head_diversity'), '.4f')} | {_fmt(x.get('top_p_mass'), '.3f')} |")
    return lines


# -------------------------------------------------------------------------------------------------- across seeds
class SeedComparisons:
    """`seeds.seed_bootstrap` of two lists of complete records (two presets' runs, one per seed) on their shared
    test references; each pair of lists is computed once (the tables and the claims ask for the same ones)."""

    def __init__(self, output_dir: Path, n_samples: int):
        self.output_dir, self.n_samples, self.done = Path(output_dir), n_samples, {}

    def __call__(self, a: list[dict], b: list[dict]) -> dict:
        key = (tuple(r["name"] for r in a), tuple(r["name"] for r in b))
        if key not in self.done:
            refs = shared_references(self.output_dir, a + b)
            self.done[key] = seed_bootstrap([r["hypotheses"] for r in a], [r["hypotheses"] for r in b], refs,
                                            self.n_samples)
        return self.done[key]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _seed_list(runs: list[dict]) -> str:
    failed = len(runs) - len(complete(runs))
    return ", ".join(str(r["spec"]["seed"]) for r in complete(runs)) + (f"; {failed} failed" if failed else "")


def _failure(runs: list[dict]) -> str:
    r = next((r for r in runs if r["status"] != "complete"), runs[0])
    return f"failed: {r.get('error', r['status'])}" if r["status"] != "complete" else "no test translations"


def across_seeds_table(runs: dict, seed_cmp, presets: list[str]) -> tuple[list[str], dict]:
    """A group's presets (``runs``: {preset: records by seed}): seeds, BLEU and chrF mean ± sd, mean BP, and the
    seed-aware ΔBLEU / ΔchrF against softmax where both have >= `MIN_SEEDS` seeds."""
    lines = ["| preset | seeds | BLEU mean ± sd | chrF mean ± sd | BP | ΔBLEU vs softmax, seed-aware [95% CI] | p | "
             "ΔchrF [95% CI] |", "|---|---|---|---|---|---|---|---|"]
    data = {}
    for p in presets:
        done = complete(runs[p])
        if not done:
            lines.append(f"| {p} | {_failure(runs[p])} | | | | | | |")
            continue
        if p == "softmax" or "softmax" not in runs:
            result, cells = None, ("(baseline)" if p == "softmax" else "no softmax run", "", "")
        else:
            result, reason = seed_delta(runs[p], runs["softmax"], seed_cmp)
            cells = (delta_ci(result["bleu"]), p_text(result["bleu"]["p_value"]), delta_ci(result["chrf"])) \
                if result else (reason, "", "")
        bleu, chrf = [r["results"]["bleu"] for r in done], [r["results"]["chrf"] for r in done]
        bp = _mean(show_value(r, "bp") for r in done)
        lines.append(f"| {p} | {_seed_list(runs[p])} | {mean_sd(bleu)} | {mean_sd(chrf)} | {_fmt(bp, '.3f')} | "
                     f"{' | '.join(cells)} |")
        data[p] = {"seeds": [r["spec"]["seed"] for r in done], "bleu": bleu, "chrf": chrf, "bp": bp,
                   "vs_softmax": result}
    return lines, data


def bleu_by_length(runs: dict, presets: list[str], sources: list[str], references: list[str]) -> dict:
    """Test sentences bucketed by source length in words (`LENGTH_EDGES`): ``{"buckets", "sentences", "bleu":
    {preset: [BLEU per bucket, mean over its seeds; None for an empty bucket]}}``."""
    bucket = np.array([bucket_of(words(s), LENGTH_EDGES) for s in sources])
    labels = bucket_labels(LENGTH_EDGES)
    counts = [int((bucket == b).sum()) for b in range(len(labels))]
    metric = scorer("bleu", tuple(references))
    bleu = {}
    for p in presets:
        stats = [run_stats("bleu", r["hypotheses"], references) for r in complete(runs[p])]
        if stats:
            bleu[p] = [_mean(corpus_score(metric, s[bucket == b].sum(0)) for s in stats) if counts[b] else None
                       for b in range(len(labels))]
    return {"buckets": labels, "sentences": counts, "bleu": bleu}


def length_table(data: dict) -> list[str]:
    head = " | ".join(f"{b} words ({n})" for b, n in zip(data["buckets"], data["sentences"]))
    lines = [f"| preset | {head} |", "|---|" + "---|" * len(data["buckets"])]
    return lines + [f"| {p} | " + " | ".join(_fmt(v) for v in vals) + " |" for p, vals in data["bleu"].items()]


def length_section(output_dir: Path, runs: dict, presets: list[str], path: Path, title: str) -> tuple[list[str], dict]:
    """BLEU by source length for one group: the table and its plot (nothing when no run of the group finished)."""
    done = [r for p in presets for r in complete(runs[p])]
    if not done:
        return [], {}
    sources, refs = sources_for(output_dir, done[0]), shared_references(output_dir, done)
    if len(sources) != len(refs):
        raise HfAttnInputError(f"{done[0]['setup']}: {len(sources)} cached test sources for {len(refs)} references; "
                               "delete its files in references/ to read them again")
    data = bleu_by_length(runs, presets, sources, refs)
    plot = plot_bleu_by_length(data, path, f"BLEU by source length: {title}")
    return (["BLEU by source length (test sentences bucketed by source words; mean over seeds):", ""] +
            length_table(data) + ["", f"![BLEU by source length]({plot.relative_to(output_dir)})", ""]), data


def across_seeds_sections(output_dir: Path, records: list[dict], seed_cmp, order: dict) -> tuple[list[str], dict]:
    """One "Across seeds" section per group (base, pair, budget, flags): `across_seeds_table` and `length_section`."""
    md, data = [], {}
    groups = group_records(records)
    for key in sorted(groups):
        runs, name, title = groups[key], group_name(key), group_title(key)
        presets = sorted(runs, key=lambda p: (p != "softmax", min(order.get(r["name"], 1e9) for r in runs[p]), p))
        table, scores = across_seeds_table(runs, seed_cmp, presets)
        lengths, by_length = length_section(output_dir, runs, presets, output_dir / "plots" / f"length_{name}.png",
                                            title)
        md += [f"## Across seeds: {title}", ""] + table + [""] + lengths
        data[name] = {"title": title, "presets": scores, "bleu_by_length": by_length}
    return md, data


# -------------------------------------------------------------------------------------------------- experiments
SHOW = {"bp": ("BP", ".3f"), "gmm_gate": ("GMM gate, mean over layers", ".2f"),
        "calibration_mask_mean": ("calibration mask m, mean over layers", ".2f"),
        "source_use": ("source probe: loss shuffled - true", ".2f")}
SITE_STATS = (*STATS, "top_p_mass")
RULES = {"above": (lambda lo, hi, m: lo > m, "interval above {m:g}"),
         "below": (lambda lo, hi, m: hi < m, "interval below {m:g}"),
         "not_below": (lambda lo, hi, m: hi >= m, "interval reaches {m:g} or above")}
EXPERIMENT_KEYS = ("id", "title", "question", "steps", "arms", "cells", "show", "rules")


def show_value(record: dict, column: str) -> float | None:
    """One run's figure for a column: ``bp``, ``gmm_gate`` (mean over layers), ``calibration_mask_mean`` (mean m
    over layers), ``source_use`` (the source probe's loss with shuffled sources minus with the true ones) or
    ``STAT.SITE`` (e.g. ``entropy.cross``, from the attention statistics); None where it has none."""
    a = record.get("analysis") or {}
    if column == "bp":
        return ((record.get("results") or {}).get("bleu_details") or {}).get("bp")
    if column == "gmm_gate":
        return _mean(a.get("gmm_gate", {}).values())
    if column == "calibration_mask_mean":
        return _mean(v["mean_mask"] for v in a.get("calibration_mask", {}).values())
    if column == "source_use":  # how much worse the loss gets with every source moved to the next pair: ~0 = unread
        probe = a.get("probe") or {}
        return probe["loss_shuffled"] - probe["loss_true"] if "loss_true" in probe else None
    stat, site = column.split(".")
    return ((a.get("attention") or {}).get("sites") or {}).get(site, {}).get(stat)


def _known_column(column) -> bool:
    return column in SHOW or (isinstance(column, str) and column.count(".") == 1 and
                              column.split(".")[0] in SITE_STATS and column.split(".")[1] in SITES)


def _column_head(column: str) -> tuple[str, str]:
    if column in SHOW:
        return SHOW[column]
    stat, site = column.split(".")
    return f"{site} {stat.replace('_', ' ')}", ".3f" if stat != "entropy" else ".2f"


def load_experiments(output_dir: Path) -> dict | None:
    """``output_dir/experiments.json``, checked; None when there is none."""
    path = Path(output_dir, "experiments.json")
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise HfAttnInputError(f"{path}: not valid JSON ({e})") from None
    check_experiments(spec, path)
    return spec


def check_experiments(spec, path) -> None:
    """One error line for the first thing wrong in an experiments file (format: see `experiments_section`)."""
    def need(ok, what):
        if not ok:
            raise HfAttnInputError(f"{path}: {what}")

    need(isinstance(spec, dict) and isinstance(spec.get("experiments"), list), 'needs a list "experiments"')
    need(isinstance(spec.get("pair"), str) and spec["pair"].count("-") == 1, '"pair" must be SOURCE-TARGET, e.g. de-en')
    need(isinstance(spec.get("base"), str), '"base" must be a base model, e.g. marian')
    need(isinstance(spec.get("seeds"), list) and spec["seeds"] and all(type(s) is int for s in spec["seeds"]),
         '"seeds" must be a list of integer seeds')
    ids = [e.get("id") if isinstance(e, dict) else None for e in spec["experiments"]]
    need(all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids),
         'every experiment needs its own "id"')
    for e in spec["experiments"]:
        where = f"experiment {e['id']!r}"
        need(all(k in e for k in EXPERIMENT_KEYS), f"{where} needs {', '.join(EXPERIMENT_KEYS)}")
        need(type(e["steps"]) is int and e["steps"] > 0, f'{where}: "steps" must be a positive integer')
        need(isinstance(e["arms"], dict) and all(isinstance(f, list) and all(isinstance(x, str) for x in f)
                                                 for f in e["arms"].values()),
             f'{where}: "arms" maps names to flag lists')
        for cell in e["cells"]:
            need(isinstance(cell, str) and cell.count("@") == 1 and cell.split("@")[1] in e["arms"],
                 f"{where}: cell {cell!r} is not PRESET@ARM with an arm of \"arms\"")
        for column in e["show"]:
            need(_known_column(column), f"{where}: show {column!r} is not one of {', '.join(SHOW)} or STAT.SITE "
                                        f"({'/'.join(SITE_STATS)} . {'/'.join(SITES)})")
        for rule in e["rules"]:
            need(isinstance(rule, dict) and isinstance(rule.get("claim"), str) and rule.get("type") in RULES and
                 rule.get("a") in e["cells"] and rule.get("b") in e["cells"] and
                 isinstance(rule.get("margin"), (int, float)) and not isinstance(rule.get("margin"), bool),
                 f"{where}: rule {rule.get('claim') if isinstance(rule, dict) else rule!r} needs a claim, a type "
                 f"({', '.join(RULES)}), cells a and b from \"cells\" and a numeric margin")


def cell_records(records: list[dict], spec: dict, experiment: dict, cell: str) -> list[dict]:
    """The runs of a cell PRESET@ARM: that preset with exactly the arm's flags, at the file's pair and base, the
    experiment's budget and one of the file's seeds (any status), by seed."""
    preset, arm = cell.split("@")
    source, target = spec["pair"].split("-")
    want = {"preset": preset, "source": source, "target": target, "steps": experiment["steps"], "base": spec["base"]}
    found = [r for r in records if all(r["spec"].get(k) == v for k, v in want.items())
             and list(r["spec"].get("train_args") or []) == experiment["arms"][arm]
             and r["spec"]["seed"] in spec["seeds"]]
    return sorted(found, key=lambda r: r["spec"]["seed"])


def judge_rule(rule: dict, cells: dict, seed_cmp) -> dict:
    """A rule on ΔBLEU = a - b: "met" / "not met" on the seed-aware interval, or why it is not judged."""
    result, reason = seed_delta(cells[rule["a"]], cells[rule["b"]], seed_cmp)
    verdict = reason
    if result:
        lo, hi = result["bleu"]["ci"]
        verdict = "met" if RULES[rule["type"]][0](lo, hi, rule["margin"]) else "not met"
    return {**rule, "verdict": verdict, "bleu": result["bleu"] if result else None}


def experiment_table(experiment: dict, cells: dict, seed_cmp) -> tuple[list[str], list[dict]]:
    """A row per cell: seeds, BLEU and chrF mean ± sd, the ``show`` columns (mean over seeds), and ΔBLEU against the
    first cell, seed-aware."""
    heads = [_column_head(c) for c in experiment["show"]]
    first = experiment["cells"][0]
    lines = ["| cell | seeds | BLEU mean ± sd | chrF mean ± sd | " + "".join(f"{h} | " for h, _ in heads) +
             f"ΔBLEU vs `{first}`, seed-aware [95% CI] | p |", "|---|---|---|---|" + "---|" * len(heads) + "---|---|"]
    rows = []
    for cell in experiment["cells"]:
        runs, done = cells[cell], complete(cells[cell])
        bleu, chrf = [r["results"]["bleu"] for r in done], [r["results"]["chrf"] for r in done]
        shown = {c: _mean(show_value(r, c) for r in done) for c in experiment["show"]}
        result, reason = (None, "(reference)") if cell == first else seed_delta(runs, cells[first], seed_cmp)
        seeds = _seed_list(runs) if done else ("not run yet" if not runs else _failure(runs))
        lines.append(f"| `{cell}` | {seeds} | {mean_sd(bleu)} | {mean_sd(chrf)} | " +
                     "".join(f"{_fmt(shown[c], f)} | " for c, (_, f) in zip(experiment["show"], heads)) +
                     (f"{delta_ci(result['bleu'])} | {p_text(result['bleu']['p_value'])} |" if result
                      else f"{reason} | |"))
        rows.append({"cell": cell, "seeds": [r["spec"]["seed"] for r in done], "failed": len(runs) - len(done),
                     "bleu": bleu, "chrf": chrf, "show": shown, "vs_first": result["bleu"] if result else None})
    return lines, rows


def rules_table(rules: list[dict]) -> list[str]:
    lines = ["| claim | ΔBLEU of | rule | ΔBLEU [95% CI], p | verdict |", "|---|---|---|---|---|"]
    for r in rules:
        d = r["bleu"]
        seen = f"{delta_ci(d)}, p {p_text(d['p_value'])}" if d else "-"
        lines.append(f"| {r['claim']} | `{r['a']}` - `{r['b']}` | {RULES[r['type']][1].format(m=r['margin'])} | "
                     f"{seen} | {r['verdict']} |")
    return lines


def plot_experiment(experiment: dict, cells: dict, path: Path) -> Path:
    """One row per cell: each seed's BLEU as a dot and the mean as a bar, the first cell's mean as a dashed line."""
    plt = pyplot()
    names = experiment["cells"]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2))
    for i, cell in enumerate(names):
        bleu = [r["results"]["bleu"] for r in cells[cell] if r["status"] == "complete"]
        if bleu:
            ax.barh(i, statistics.mean(bleu), color="tab:gray" if i == 0 else "tab:blue", alpha=0.35)
            ax.scatter(bleu, [i] * len(bleu), color="black", s=12, zorder=3)
    first = [r["results"]["bleu"] for r in cells[names[0]] if r["status"] == "complete"]
    if first:
        ax.axvline(statistics.mean(first), color="tab:gray", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"test BLEU after {experiment['steps']:,} steps (dots: seeds; bar: mean)")
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path, f"{experiment['title']} ({experiment['id']})")


def experiments_section(spec: dict, records: list[dict], seed_cmp, n_samples: int,
                        output_dir: Path | None = None) -> tuple[list[str], list[dict]]:
    """"Recipe sensitivity": per experiment of ``experiments.json`` its question, arms, cells and rules judged, and
    (with ``output_dir``) a plot of the cells' BLEU in ``output_dir/plots``."""
    md = ["## Recipe sensitivity", "",
          "The experiments below, their cells and their rules come from `experiments.json`, which was committed before "
          "any of their runs: the criteria were fixed before the results were seen. A cell PRESET@ARM is the runs of "
          f"that preset with the arm's extra `hf-attn train` flags ({spec['pair']}, {spec['base']}, seeds "
          f"{', '.join(map(str, spec['seeds']))}). A rule judges ΔBLEU = a - b by its seed-aware 95% interval "
          f"(`seed_bootstrap`, {n_samples} resamples of test sentences and training seeds together), only when both "
          f"cells have at least {MIN_SEEDS} seeds: \"above\" is met when the interval lies above the margin, \"below\" "
          "when it lies below, \"not_below\" when its upper end reaches the margin or more.", ""]
    data = []
    for e in spec["experiments"]:
        cells = {c: cell_records(records, spec, e, c) for c in e["cells"]}
        table, rows = experiment_table(e, cells, seed_cmp)
        rules = [judge_rule(rule, cells, seed_cmp) for rule in e["rules"]]
        arms = "; ".join(f"`{a}` " + (f"`{' '.join(f)}`" if f else "(the recipe as it is)")
                         for a, f in e["arms"].items())
        md += [f'<a id="experiment-{e["id"]}"></a>', "", f"### {e['title']} (`{e['id']}`)", "",
               f"Question: {e['question']}", ""] + ([f"Derivation: {e['derivation']}", ""] if e.get("derivation") else [])
        md += [f"{e['steps']:,} steps. Arms: {arms}.", ""]
        md += table + [""]
        if output_dir is not None:
            plot = plot_experiment(e, cells, Path(output_dir) / "plots" / f"experiment_{e['id']}.png")
            md += [f"![{e['id']}]({plot.relative_to(output_dir)})", ""]
        md += rules_table(rules) + [""]
        if e.get("conclusion"):
            md += [f"**Conclusion** (written after the runs, from the rules above): {e['conclusion']}", ""]
        data.append({"id": e["id"], "title": e["title"], "question": e["question"], "steps": e["steps"],
                     "arms": e["arms"], "cells": rows, "rules": rules, "conclusion": e.get("conclusion")})
    return md, data


# -------------------------------------------------------------------------------------------------- plots
def plot_validation_curves(records: list[dict], path: Path, title: str) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in records:
        curve = (r.get("results") or {}).get("curves", {}).get("validation_loss") or []
        if curve:
            s = r["spec"]
            ax.plot([x[0] for x in curve], [x[1] for x in curve], marker=".",
                    label=f"{s['preset']} ({s['steps']} steps, seed {s['seed']})")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("validation loss (label-smoothed CE)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def plot_scores(runs: list[dict], sig: dict, path: Path, title: str) -> Path:
    """BLEU and chrF per preset with the 95% bootstrap interval of each system."""
    plt = pyplot()
    done = [r for r in runs if r["status"] == "complete"]
    fig, axes = plt.subplots(1, 2, figsize=(max(6, 0.6 * len(done) + 3), 4.5))
    for ax, metric in zip(axes, ("bleu", "chrf")):
        names = [r["spec"]["preset"] for r in done]
        vals = [r["results"][metric] for r in done]
        base_ci = next((s[metric]["baseline_ci"] for s in sig.values()), 0.0)
        errs = [sig[r["name"]][metric]["system_ci"] if r["name"] in sig else (base_ci if r["spec"]["preset"] == "softmax" else 0)
                for r in done]
        colors = ["tab:gray" if n == "softmax" else "tab:blue" for n in names]
        ax.bar(range(len(done)), vals, yerr=errs, color=colors, capsize=3)
        ax.set_xticks(range(len(done)), names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel(f"{'BLEU' if metric == 'bleu' else 'chrF'} (test, 95% bootstrap CI)")
        ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, title)


def plot_bleu_by_length(data: dict, path: Path, title: str) -> Path:
    """BLEU (mean over seeds) per source-length bucket, one line per preset."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    others = [p for p in data["bleu"] if p != "softmax"]  # ten colours, then the next line style
    for p, vals in data["bleu"].items():
        k = others.index(p) if p != "softmax" else 0
        ax.plot(range(len(vals)), [float("nan") if v is None else v for v in vals], marker="o", label=p,
                color="black" if p == "softmax" else f"C{k % 10}", linestyle=("-", "--", ":")[(k // 10) % 3],
                linewidth=2.5 if p == "softmax" else 1.2)
    ax.set_xticks(range(len(data["buckets"])),
                  [f"{b}\n{n} sentences" for b, n in zip(data["buckets"], data["sentences"])], fontsize=8)
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("BLEU (test, mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return save_figure(fig, path, title)


def plot_attention_stats(runs: list[dict], path: Path, title: str) -> Path:
    """One panel per (statistic, site), one bar per preset."""
    plt = pyplot()
    done = [r for r in runs if r["status"] == "complete"]
    fig, axes = plt.subplots(len(STATS), len(SITES), figsize=(4 * len(SITES), 2.4 * len(STATS)), squeeze=False)
    for i, stat in enumerate(STATS):
        for j, site in enumerate(SITES):
            ax = axes[i][j]
            vals = [r["analysis"]["attention"]["sites"].get(site, {}).get(stat, float("nan")) for r in done]
            ax.bar(range(len(done)), vals, color="tab:green")
            ax.set_xticks(range(len(done)), [r["spec"]["preset"] for r in done] if i == len(STATS) - 1 else
                          [""] * len(done), rotation=70, ha="right", fontsize=7)
            ax.set_title(f"{site}: {stat.replace('_', ' ')}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, title)


# -------------------------------------------------------------------------------------------------- the report
def load_benchmarks(output_dir: Path) -> dict[str, BenchmarkResult]:
    """{"benchmark/<file>": result} for the sentence-level `scripts/benchmark.py` results (JSON) in
    ``output_dir/benchmark``: controlled speed ratios for the speed claims (``--long`` results, and ``--compile``
    ones, where every model runs compiled, are left out: the claims are judged on the models as they run eagerly;
    files that are not benchmark results, such as ``gmm_budget.json``, are skipped)."""
    found = {}
    for path in sorted(Path(output_dir, "benchmark").glob("*.json")):
        try:
            result = load_result(path)
        except NotABenchmarkResult:
            continue
        if not result.is_long and not result.settings.compile:
            found[f"benchmark/{path.name}"] = result
    return found


def write_report(output_dir: Path, n_samples: int = 1000, command: str = "", readme: Path | None = None,
                 docs: Path | None = None) -> Path:
    """Rebuild ``REPORT.md``, ``report.json`` and ``plots/`` in ``output_dir`` from its records; with ``readme``, also
    the README's headline block, with ``docs``, the "What we measured" block of each paper's page under it."""
    output_dir = Path(output_dir)
    records = load_records(output_dir)
    experiments = load_experiments(output_dir)
    plan = json.loads((output_dir / "plan.json").read_text()) if (output_dir / "plan.json").is_file() else []
    sig = compare(output_dir, records, n_samples)
    seed_cmp = SeedComparisons(output_dir, n_samples)
    by_setup = defaultdict(list)
    for r in records:
        by_setup[r["setup"]].append(r)
    order = {}
    for i, name in enumerate(plan):
        order.setdefault(name, i)
    plots = output_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    md = ["# hf-attn reproduction report", "",
          "Generated by `hf-attn reproduce` from the run records in `runs/` (one JSON and the test translations per "
          "run); do not edit by hand.", "",
          "Statistics. One training run says little about a method: the same configuration trained with another seed "
          "moves BLEU by up to a few points (the ± columns). So runs that differ only in their seed form a group, and "
          "\"Across seeds\" gives each preset's mean ± standard deviation over its seeds and its difference from "
          "softmax with a seed-aware 95% interval and p-value: a bootstrap that resamples the test sentences and the "
          f"training seeds together ({n_samples} resamples; with 3 seeds it still underestimates the seed variance "
          f"somewhat), given only where both presets have at least {MIN_SEEDS} seeds. The claims on BLEU and the "
          "recipe experiments are judged on that interval alone. The per-seed sections after them compare the runs of "
          f"one seed by paired bootstrap resampling (sacrebleu `PairedTest`, {n_samples} resamples), which resamples "
          "test sentences only and ignores the variance between training seeds: per-seed detail, not a verdict. BP is "
          "BLEU's brevity penalty (1 = the translations are, in all, at least as long as the references).", ""]
    if command:
        md += [f"Last command: `{relative_command(command)}`", ""]
    md += ["Speeds (train tok/s, decode sent/s) are measured while the matrix runs two trainings at a time on the "
           "machines listed at the end, next to whatever else they did: read them as rough, and "
           "`scripts/benchmark.py` for ratios.", ""]
    recipe = next((r["results"].get("recipe") for r in records if r.get("results")), None)
    if recipe:
        md += [f"Recipe of every run: {recipe}; the `hf-attn train` defaults otherwise (README, \"The main job\").", ""]
    pending = [n for n in plan if n not in {r["name"] for r in records}]
    if pending:
        md += [f"**Still to run ({len(pending)}):** " + ", ".join(f"`{n}`" for n in pending) +
               " (`hf-attn reproduce` with the same flags resumes them).", ""]
    across_md, across = across_seeds_sections(output_dir, records, seed_cmp, order)
    summary = {"setups": {}, "significance": sig, "across_seeds": across}
    experiments_md = []
    if experiments:
        experiments_md, summary["experiments"] = experiments_section(experiments, records, seed_cmp, n_samples,
                                                                     output_dir)
    ids = [e["id"] for e in (experiments or {}).get("experiments", [])]
    claims_md, summary["claims"] = claims_section(records, sig, load_benchmarks(output_dir), seed_cmp, ids)
    detail_md = []
    for setup in sorted(by_setup, key=lambda s: (by_setup[s][0]["spec"]["base"], by_setup[s][0]["spec"]["source"],
                                                 by_setup[s][0]["spec"]["steps"], by_setup[s][0]["spec"]["seed"])):
        runs = sorted(by_setup[setup], key=lambda r: (r["spec"]["preset"] != "softmax", order.get(r["name"], 1e9), r["name"]))
        title = _setup_title(runs[0])
        detail_md += [f"## {title}", "",
                      "Per-seed detail: the paired bootstrap resamples this seed's test sentences only.", ""]
        detail_md += headline_table(runs, sig) + [""]
        detail_md += [f"Attention on the first {runs[0].get('analysis', {}).get('attention', {}).get('sentences', '?')} "
                      "test pairs (teacher forcing), mean over layers:", ""] + attention_table(runs) + [""]
        extras = variant_lines(runs)
        if extras:
            detail_md += extras + [""]
        p1 = plot_scores(runs, sig, plots / f"scores_{setup}.png", f"Test scores: {title}")
        p2 = plot_attention_stats(runs, plots / f"attention_{setup}.png", f"Attention statistics: {title}")
        detail_md += [f"![scores]({p1.relative_to(output_dir)})", f"![attention]({p2.relative_to(output_dir)})", ""]
        summary["setups"][setup] = {"title": title, "runs": [r["name"] for r in runs]}
    pairs = defaultdict(list)
    for r in records:
        pairs[(r["spec"]["base"], r["spec"]["source"], r["spec"]["target"])].append(r)
    detail_md += ["## Validation loss against step", ""]
    for (base, s, t), rs in sorted(pairs.items()):
        p = plot_validation_curves(rs, plots / f"validation_{base}_{s}-{t}.png", f"Validation loss, {s}->{t} ({base})")
        detail_md += [f"![validation loss {s}-{t}]({p.relative_to(output_dir)})", ""]
    md += ["Contents: " + ", ".join(f"[{t}](#{a})" for t, a in (
        ("Recipe sensitivity", "recipe-sensitivity"), ("What the papers claim", "what-the-papers-claim-and-what-we-see"),
        ("Across seeds", "across-seeds"), ("Per-seed detail", "per-seed-detail")) if experiments or a != "recipe-sensitivity"), ""]
    md += experiments_md + claims_md
    md += ['<a id="across-seeds"></a>', ""] + across_md
    md += ['<a id="per-seed-detail"></a>', ""] + detail_md
    md += ["## Signatures", ""] + sorted({f"- BLEU `{r['results']['bleu_signature']}`, chrF `{r['results']['chrf_signature']}`"
                                         for r in records if r.get("results")}) + [""]
    md += ["## Machines", ""] + machine_lines(records) + [""]
    (output_dir / "REPORT.md").write_text("\n".join(md), encoding="utf-8")
    (output_dir / "report.json").write_text(dumps_strict(summary, indent=1), encoding="utf-8")
    if readme is not None:
        update_readme(Path(readme), records, seed_cmp, order)
    if docs is not None:
        update_paper_pages(Path(docs), json.loads((output_dir / "report.json").read_text(encoding="utf-8")))
    return output_dir / "REPORT.md"


def machine_lines(records: list[dict]) -> list[str]:
    """One line per machine setup (the `device` of results.json): all runs, or the runs it trained (the tokens/s
    columns compare only within a setup)."""
    runs = defaultdict(list)
    for r in records:
        if r.get("results"):
            runs[r["results"]["device"]].append(r["name"])
    if len(runs) == 1:
        return [f"- {device}: all runs" for device in runs]
    return [f"- {device}: {', '.join(sorted(names))}" for device, names in sorted(runs.items())]


def variant_lines(runs: list[dict]) -> list[str]:
    out = []
    for r in runs:
        a = r.get("analysis") or {}
        if "gmm_gate" in a:
            out.append(f"- `{r['spec']['preset']}`: mean GMM gate g (the mixture's share, Eq. 13) per decoder layer: "
                       + ", ".join(f"L{int(k) + 1} {v:.2f}" for k, v in a["gmm_gate"].items()))
        if "calibration_mask" in a:
            out.append(f"- `{r['spec']['preset']}`: calibration masks per decoder layer (mean m / share of source "
                       "tokens removed, m < 0.5 / share of the importance 1 - m on the top 10% of tokens): "
                       + "; ".join(f"L{int(k) + 1} {v['mean_mask']:.2f} / {v['removed_share']:.2f} / "
                                   f"{v['importance_top10_mass']:.2f}" for k, v in a["calibration_mask"].items()))
    return out


HEADLINE_START, HEADLINE_END = "<!-- reproduce-headline:start -->", "<!-- reproduce-headline:end -->"


def readme_groups(records: list[dict]) -> list[tuple]:
    """The groups the README quotes: runs of the adopted recipe (no extra flags) in which at least two presets have
    `MIN_SEEDS` complete seeds, the longest budget first."""
    groups = group_records(records)
    keep = [key for key, runs in groups.items()
            if not key[-1] and sum(len(complete(rs)) >= MIN_SEEDS for rs in runs.values()) >= 2]
    return sorted(keep, key=lambda k: (-k[3], k[1], k[2], k[0]))


def update_readme(readme: Path, records: list[dict], seed_cmp, order: dict | None = None) -> None:
    """Replace the block between the headline markers in the README with the seed-aware tables of `readme_groups`
    (the presets with `MIN_SEEDS` seeds or more)."""
    body, groups = [], group_records(records)
    for key in readme_groups(records):
        runs = {p: rs for p, rs in groups[key].items() if len(complete(rs)) >= MIN_SEEDS}
        presets = sorted(runs, key=lambda p: (p != "softmax", min((order or {}).get(r["name"], 1e9) for r in runs[p]), p))
        table, _ = across_seeds_table(runs, seed_cmp, presets)
        body += ([""] if body else []) + [
            f"From [results/REPORT.md](results/REPORT.md#across-seeds) ({group_title(key)}; the presets with "
            f"{MIN_SEEDS} seeds or more; generated by `hf-attn reproduce`):", ""] + table
    replace_marked_block(readme, HEADLINE_START, HEADLINE_END,
                         "\n".join(body or [f"(no group of runs with {MIN_SEEDS} seeds of two presets yet)"]))
