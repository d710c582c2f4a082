"""The report's tables of runs: per seed (one setup's runs against softmax of the same seed, by paired bootstrap
resampling of the test sentences) and across seeds (a group's presets, seed-aware), and the lines on variants and
machines."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest

from ..modeling.hyperparameters import SITES
from .claims import delta_ci
from .columns import failure_text, fmt, mean_of, seed_list, show_value
from .lengths import length_section
from .machines import machines_line
from .records import references_for
from .seeds import complete, group_name, group_records, group_title, mean_sd, p_text, seed_delta


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


def setup_title(rec: dict) -> str:
    s = rec["spec"]
    extra = f", flags `{' '.join(s['train_args'])}`" if s.get("train_args") else ""
    return f"{s['source']}->{s['target']}, {s['steps']} steps, seed {s['seed']}, {s['base']}{extra}"


def compare(output_dir: Path, records: list[dict], n_samples: int, progress=None) -> dict:
    """``{name: paired_bootstrap(...)}`` of every complete record against softmax of its setup (a step of the tqdm
    bar ``progress`` each)."""
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
                if progress is not None:
                    progress.update()
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
        lines.append(f"| {p} | {res['bleu']:.1f} | {res['chrf']:.1f} | {fmt(show_value(r, 'bp'), '.3f')} | {d[0]} | "
                     f"{d[1]} | {d[2]} | {fmt(res.get('validation_loss'), '.3f')} | "
                     f"{probe['loss_true']:.2f} / {probe['loss_shuffled']:.2f} | "
                     f"{fmt(res.get('tokens_per_second'), '.0f')} | {fmt(res.get('decode_sentences_per_second'), '.1f')} |")
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
                lines.append(f"| {r['spec']['preset']} | {site} | {fmt(x.get('sparsity'), '.3f')} | "
                             f"{fmt(x.get('null_rate'), '.3f')} | {fmt(x.get('entropy'), '.3f')} | "
                             f"{fmt(x.get('head_diversity'), '.4f')} | {fmt(x.get('top_p_mass'), '.3f')} |")
    return lines


def across_seeds_table(runs: dict, seed_cmp, presets: list[str]) -> tuple[list[str], dict]:
    """A group's presets (``runs``: {preset: records by seed}): seeds, BLEU and chrF mean ± sd, mean BP, and the
    seed-aware ΔBLEU / ΔchrF against softmax where both have >= `MIN_SEEDS` seeds."""
    lines = ["| preset | seeds | BLEU mean ± sd | chrF mean ± sd | BP | ΔBLEU vs softmax, seed-aware [95% CI] | p | "
             "ΔchrF [95% CI] |", "|---|---|---|---|---|---|---|---|"]
    data = {}
    for p in presets:
        done = complete(runs[p])
        if not done:
            lines.append(f"| {p} | {failure_text(runs[p])} | | | | | | |")
            continue
        if p == "softmax" or "softmax" not in runs:
            result, cells = None, ("(baseline)" if p == "softmax" else "no softmax run", "", "")
        else:
            result, reason = seed_delta(runs[p], runs["softmax"], seed_cmp)
            cells = (delta_ci(result["bleu"]), p_text(result["bleu"]["p_value"]), delta_ci(result["chrf"])) \
                if result else (reason, "", "")
        bleu, chrf = [r["results"]["bleu"] for r in done], [r["results"]["chrf"] for r in done]
        bp = mean_of(show_value(r, "bp") for r in done)
        lines.append(f"| {p} | {seed_list(runs[p])} | {mean_sd(bleu)} | {mean_sd(chrf)} | {fmt(bp, '.3f')} | "
                     f"{' | '.join(cells)} |")
        data[p] = {"seeds": [r["spec"]["seed"] for r in done], "bleu": bleu, "chrf": chrf, "bp": bp,
                   "vs_softmax": result}
    return lines, data


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
        md += [f"## Across seeds: {title}", ""] + table + ["", machines_line([r for rs in runs.values() for r in rs]),
                                                           ""] + lengths
        data[name] = {"title": title, "presets": scores, "bleu_by_length": by_length}
    return md, data


def machine_lines(records: list[dict], others: list[dict] = ()) -> list[str]:
    """One line per machine setup (the `device` of results.json): all runs, or the runs it trained (the tokens/s
    columns compare only within a setup); ``others``: the records of runs recorded on two kinds of machine that the
    tables leave out (`machines.one_kind_per_group`)."""
    runs = defaultdict(list)
    for r in records:
        if r.get("results"):
            runs[r["results"]["device"]].append(r["name"])
    for r in others:
        if r.get("results"):
            runs[r["results"]["device"]].append(f"{r['name']} (the record the tables leave out)")
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
