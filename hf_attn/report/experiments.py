""""Recipe sensitivity": the experiments of ``experiments.json``, whose questions, cells and rules were fixed
before their runs, checked, tabled and judged on the seed-aware interval."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HfAttnInputError
from ..modeling.hyperparameters import SITES
from ..plans.rules import RULES
from .claims import delta_ci
from .columns import SHOW, SITE_STATS, column_head, failure_text, fmt, known_column, mean_of, seed_list, show_value
from .plots import plot_experiment
from .seeds import MIN_SEEDS, complete, mean_sd, p_text, seed_delta


EXPERIMENT_KEYS = ("id", "title", "question", "steps", "arms", "cells", "show", "rules")


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
            need(known_column(column), f"{where}: show {column!r} is not one of {', '.join(SHOW)} or STAT.SITE "
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
    heads = [column_head(c) for c in experiment["show"]]
    first = experiment["cells"][0]
    lines = ["| cell | seeds | BLEU mean ± sd | chrF mean ± sd | " + "".join(f"{h} | " for h, _ in heads) +
             f"ΔBLEU vs `{first}`, seed-aware [95% CI] | p |", "|---|---|---|---|" + "---|" * len(heads) + "---|---|"]
    rows = []
    for cell in experiment["cells"]:
        runs, done = cells[cell], complete(cells[cell])
        bleu, chrf = [r["results"]["bleu"] for r in done], [r["results"]["chrf"] for r in done]
        shown = {c: mean_of(show_value(r, c) for r in done) for c in experiment["show"]}
        result, reason = (None, "(reference)") if cell == first else seed_delta(runs, cells[first], seed_cmp)
        seeds = seed_list(runs) if done else ("not run yet" if not runs else failure_text(runs))
        lines.append(f"| `{cell}` | {seeds} | {mean_sd(bleu)} | {mean_sd(chrf)} | " +
                     "".join(f"{fmt(shown[c], f)} | " for c, (_, f) in zip(experiment["show"], heads)) +
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
