"""The reproduction report: ``REPORT.md``, ``report.json`` and PNG plots, rebuilt from the run records alone.

Every number in it comes from a record that `runner.run_one` wrote (``runs/<name>.json`` and the test translations
beside it); nothing is typed by hand. Significance: each preset against ``softmax`` of the same setup (pair, budget,
seed, base, flags) by paired bootstrap resampling (Koehn 2004) with sacrebleu's `PairedTest` (1,000 resamples,
seed 12345): the BLEU/chrF difference, its 95% interval (from the same resamples) and the p-value.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from ..analysis.common import pyplot, save_figure
from ..io_utils import dumps_strict, replace_marked_block
from .claims import claims_section, delta_ci

SITES = ("encoder", "decoder", "cross")
STATS = ("sparsity", "null_rate", "entropy", "head_diversity")


# -------------------------------------------------------------------------------------------------- records
def load_records(output_dir: Path) -> list[dict]:
    out = []
    for path in sorted(Path(output_dir, "runs").glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        hyp = path.with_suffix(".hyp.txt")
        rec["hypotheses"] = hyp.read_text(encoding="utf-8").splitlines() if hyp.is_file() else None
        out.append(rec)
    return out


def references_for(output_dir: Path, record: dict) -> list[str]:
    """The test references of a record's setup, cached in ``references/<setup>.txt`` (read once from its data)."""
    path = Path(output_dir, "references", f"{record['setup']}.txt")
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()
    from ..data import load_corpus
    from ..training.args import parse_train_args
    from .runner import RunSpec

    spec = dict(record["spec"], train_args=tuple(record["spec"].get("train_args") or ()))
    hargs, _, _, _ = parse_train_args(RunSpec(**spec).train_argv(Path("unused"), False))
    corpus = load_corpus(hargs.corpus, hargs.source, hargs.target, hargs.train_file, hargs.validation_file,
                         hargs.test_file, hargs.dataset, hargs.dataset_config_name,
                         {"train": hargs.max_train_samples, "test": hargs.max_predict_samples})
    refs = corpus.pairs("test")[1]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(refs) + "\n", encoding="utf-8")
    return refs


# -------------------------------------------------------------------------------------------------- significance
def paired_bootstrap(baseline: list[str], system: list[str], references: list[str], n_samples: int = 1000) -> dict:
    """``{metric: {"delta", "ci": [lo, hi], "p_value", "system_ci", "baseline_ci"}}`` for BLEU and chrF.

    sacrebleu's `PairedTest` (test_type "bs") gives the p-value and each system's 95% interval; the interval of the
    difference is taken from the same resamples (sacrebleu's seed, its sufficient statistics)."""
    import numpy as np
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

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
    lines = ["| preset | BLEU | chrF | ΔBLEU vs softmax [95% CI] | p | ΔchrF [95% CI] | val. loss | source probe: "
             "loss true / shuffled | train tok/s | decode sent/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        p = r["spec"]["preset"]
        if r["status"] != "complete":
            lines.append(f"| {p} | failed: {r.get('error', r['status'])} | | | | | | | | |")
            continue
        res, probe = r["results"], r["analysis"]["probe"]
        s = sig.get(r["name"])
        d = (delta_ci(s["bleu"]), f"{s['bleu']['p_value']:.3f}", delta_ci(s["chrf"])) if s else \
            ("(baseline)" if p == "softmax" else "no softmax run", "", "")
        lines.append(f"| {p} | {res['bleu']:.1f} | {res['chrf']:.1f} | {d[0]} | {d[1]} | {d[2]} | "
                     f"{_fmt(res.get('validation_loss'), '.3f')} | {probe['loss_true']:.2f} / {probe['loss_shuffled']:.2f} | "
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


def seed_spread(records: list[dict]) -> tuple[list[str], dict]:
    groups = defaultdict(list)
    for r in records:
        if r["status"] == "complete":
            s = r["spec"]
            groups[(s["base"], s["source"], s["target"], s["steps"], tuple(s.get("train_args") or ()), s["preset"])].append(r)
    lines = ["| pair | steps | preset | seeds | BLEU mean ± sd | BLEU range | chrF mean ± sd |", "|---|---|---|---|---|---|---|"]
    data = {}
    for key, rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        b = [r["results"]["bleu"] for r in rs]
        c = [r["results"]["chrf"] for r in rs]
        seeds = sorted(r["spec"]["seed"] for r in rs)
        data[f"{key[1]}-{key[2]}_{key[3]}_{key[5]}"] = {"seeds": seeds, "bleu": b, "chrf": c}
        lines.append(f"| {key[1]}-{key[2]} | {key[3]} | {key[5]} | {', '.join(map(str, seeds))} | "
                     f"{statistics.mean(b):.1f} ± {statistics.stdev(b):.1f} | {min(b):.1f}-{max(b):.1f} | "
                     f"{statistics.mean(c):.1f} ± {statistics.stdev(c):.1f} |")
    return (lines if data else []), data


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
def load_benchmarks(output_dir: Path) -> dict:
    """{"benchmark/<file>": result} for the sentence-level `scripts/benchmark.py` results (JSON) in
    ``output_dir/benchmark``: controlled speed ratios for the speed claims (``--long`` results, and ``--compile``
    ones, where every model runs compiled, are left out: the claims are judged on the models as they run eagerly)."""
    found = {}
    for path in sorted(Path(output_dir, "benchmark").glob("*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        settings = result.get("settings") if isinstance(result, dict) else None
        if isinstance(settings, dict) and not settings.get("long") and not settings.get("compile") \
                and isinstance(result.get("rows"), list):
            found[f"benchmark/{path.name}"] = result
    return found


def write_report(output_dir: Path, n_samples: int = 1000, command: str = "", readme: Path | None = None) -> Path:
    """Rebuild ``REPORT.md``, ``report.json`` and ``plots/`` in ``output_dir`` from its records."""
    output_dir = Path(output_dir)
    records = load_records(output_dir)
    plan = json.loads((output_dir / "plan.json").read_text()) if (output_dir / "plan.json").is_file() else []
    sig = compare(output_dir, records, n_samples)
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
          "run); do not edit by hand. Significance: paired bootstrap resampling against `softmax` of the same "
          f"setup (sacrebleu `PairedTest`, {n_samples} resamples): the difference, its 95% interval and the p-value.",
          ""]
    if command:
        md += [f"Last command: `{command}`", ""]
    md += ["Speeds (train tok/s, decode sent/s) are measured while the matrix runs two trainings at a time on the "
           "machine below, next to whatever else it did: read them as rough, and `scripts/benchmark.py` for ratios.",
           ""]
    recipe = next((r["results"].get("recipe") for r in records if r.get("results")), None)
    if recipe:
        md += [f"Recipe of every run: {recipe}; the `hf-attn train` defaults otherwise (README, \"The main job\").", ""]
    pending = [n for n in plan if n not in {r["name"] for r in records}]
    if pending:
        md += [f"**Still to run ({len(pending)}):** " + ", ".join(f"`{n}`" for n in pending) +
               " (`hf-attn reproduce` with the same flags resumes them).", ""]
    summary = {"setups": {}, "significance": sig}
    for setup in sorted(by_setup, key=lambda s: (by_setup[s][0]["spec"]["base"], by_setup[s][0]["spec"]["source"],
                                                 by_setup[s][0]["spec"]["steps"], by_setup[s][0]["spec"]["seed"])):
        runs = sorted(by_setup[setup], key=lambda r: (r["spec"]["preset"] != "softmax", order.get(r["name"], 1e9), r["name"]))
        title = _setup_title(runs[0])
        md += [f"## {title}", ""]
        md += headline_table(runs, sig) + [""]
        md += [f"Attention on the first {runs[0].get('analysis', {}).get('attention', {}).get('sentences', '?')} test "
               "pairs (teacher forcing), mean over layers:", ""] + attention_table(runs) + [""]
        extras = variant_lines(runs)
        if extras:
            md += extras + [""]
        p1 = plot_scores(runs, sig, plots / f"scores_{setup}.png", f"Test scores: {title}")
        p2 = plot_attention_stats(runs, plots / f"attention_{setup}.png", f"Attention statistics: {title}")
        md += [f"![scores]({p1.relative_to(output_dir)})", f"![attention]({p2.relative_to(output_dir)})", ""]
        summary["setups"][setup] = {"title": title, "runs": [r["name"] for r in runs]}
    pairs = defaultdict(list)
    for r in records:
        pairs[(r["spec"]["base"], r["spec"]["source"], r["spec"]["target"])].append(r)
    md += ["## Validation loss against step", ""]
    for (base, s, t), rs in sorted(pairs.items()):
        p = plot_validation_curves(rs, plots / f"validation_{base}_{s}-{t}.png", f"Validation loss, {s}->{t} ({base})")
        md += [f"![validation loss {s}-{t}]({p.relative_to(output_dir)})", ""]
    spread_lines, spread = seed_spread(records)
    summary["seed_spread"] = spread
    if spread_lines:
        md += ["## Run-to-run spread (same configuration, different seeds)", ""] + spread_lines + [""]
    claims_md, claims = claims_section(records, sig, load_benchmarks(output_dir))
    summary["claims"] = claims
    md += claims_md
    md += ["## Signatures", ""] + sorted({f"- BLEU `{r['results']['bleu_signature']}`, chrF `{r['results']['chrf_signature']}`"
                                         for r in records if r.get("results")}) + [""]
    md += ["## Machines", ""] + machine_lines(records) + [""]
    (output_dir / "REPORT.md").write_text("\n".join(md), encoding="utf-8")
    (output_dir / "report.json").write_text(dumps_strict(summary, indent=1), encoding="utf-8")
    if readme is not None:
        update_readme(Path(readme), records, sig, order)
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


def headline_setup(records: list[dict]) -> str | None:
    """The setup the README quotes: the one with the most complete runs (ties: the shortest budget, seed first)."""
    counts = defaultdict(int)
    for r in records:
        if r["status"] == "complete" or r["status"] == "failed":
            counts[r["setup"]] += 1
    return max(counts, key=lambda s: counts[s]) if counts else None


def readme_setups(records: list[dict]) -> list[str]:
    """The setups the README quotes: the headline setup, then the longest budget of its pair, seed and base, when
    that is longer and has two runs or more (where the variants' differences start to mean something)."""
    head = headline_setup(records)
    if head is None:
        return []
    spec = next(r["spec"] for r in records if r["setup"] == head)
    kind = {k: spec.get(k) for k in ("source", "target", "seed", "base")}
    longer = defaultdict(int)
    for r in records:
        same = all(r["spec"].get(k) == v for k, v in kind.items())
        if same and r["spec"]["steps"] > spec["steps"] and r["status"] in ("complete", "failed"):
            longer[(r["spec"]["steps"], r["setup"])] += 1
    candidates = [key for key, n in longer.items() if n >= 2]
    return [head] + ([max(candidates)[1]] if candidates else [])


def update_readme(readme: Path, records: list[dict], sig: dict, order: dict | None = None) -> None:
    """Replace the block between the headline markers in the README with the report's headline tables
    (`readme_setups`)."""
    body = []
    for setup in readme_setups(records):
        runs = [r for r in records if r["setup"] == setup]
        runs.sort(key=lambda r: (r["spec"]["preset"] != "softmax", (order or {}).get(r["name"], 1e9), r["name"]))
        body += ([""] if body else []) + [
            f"From [results/REPORT.md](results/REPORT.md) ({_setup_title(runs[0])}; generated by `hf-attn reproduce`):",
            ""] + headline_table(runs, sig)
    replace_marked_block(readme, HEADLINE_START, HEADLINE_END, "\n".join(body or ["(no runs recorded yet)"]))
