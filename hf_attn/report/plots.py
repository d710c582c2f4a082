"""The report's PNG plots: validation curves, test scores, attention statistics, BLEU by source length and the
recipe experiments' cells."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..analysis.common import pyplot, save_figure
from ..analysis.stats import LAYER_KEYS
from ..modeling.hyperparameters import SITES


def plot_validation_curves(records: list[dict], path: Path, title: str) -> Path:
    """Validation loss against step for the adopted recipe's runs (no extra flags: the experiments' arms have plots
    of their own), one panel per budget: per preset the mean over its seeds at the steps they all evaluated, with
    the range across seeds shaded; softmax in black."""
    curves = defaultdict(lambda: defaultdict(list))  # steps -> preset -> [{step: loss} per seed]
    for r in records:
        curve = (r.get("results") or {}).get("curves", {}).get("validation_loss") or []
        if curve and not r["spec"].get("train_args"):
            curves[r["spec"]["steps"]][r["spec"]["preset"]].append(dict(map(tuple, curve)))
    plt = pyplot()
    budgets = sorted(curves) or [0]
    fig, axes = plt.subplots(1, len(budgets), figsize=(5.5 * len(budgets) + 2.5, 4.8), squeeze=False)
    tab20 = plt.get_cmap("tab20").colors
    for ax, steps in zip(axes[0], budgets):
        presets = sorted(curves.get(steps, {}), key=lambda p: (p != "softmax", p))
        # distinct hues first: tab10, or tab20's strong shades before its pale ones
        colours = plt.get_cmap("tab10").colors if len(presets) <= 11 else tab20[0::2] + tab20[1::2]
        for i, preset in enumerate(presets):
            seeds = curves[steps][preset]
            xs = sorted(set.intersection(*(set(c) for c in seeds)))
            ys = np.array([[c[x] for x in xs] for c in seeds])
            colour = "black" if preset == "softmax" else colours[(i - 1) % len(colours)]
            ax.plot(xs, ys.mean(0), marker=".", color=colour, label=f"{preset} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")
            if len(seeds) > 1:
                ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.15, linewidth=0)
        ax.set_title(f"{steps:,} steps" if steps else "no curves")
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper right")
    axes[0][0].set_ylabel("validation loss (label-smoothed CE)")
    return save_figure(fig, path, f"{title}: mean over seeds, range shaded")


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
    fig, axes = plt.subplots(len(LAYER_KEYS), len(SITES), figsize=(4 * len(SITES), 2.4 * len(LAYER_KEYS)),
                             squeeze=False)
    for i, stat in enumerate(LAYER_KEYS):
        for j, site in enumerate(SITES):
            ax = axes[i][j]
            vals = [r["analysis"]["attention"]["sites"].get(site, {}).get(stat, float("nan")) for r in done]
            ax.bar(range(len(done)), vals, color="tab:green")
            ax.set_xticks(range(len(done)), [r["spec"]["preset"] for r in done] if i == len(LAYER_KEYS) - 1 else
                          [""] * len(done), rotation=70, ha="right", fontsize=7)
            ax.set_title(f"{site}: {stat.replace('_', ' ')}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path, title)


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


def bleu_curve(record: dict) -> dict[int, float]:
    """{step: BLEU} of a record's validation-BLEU curve (`hf-attn train --eval_bleu_every`); empty without one."""
    curve = ((record.get("results") or {}).get("curves") or {}).get("validation_bleu") or {}
    return {int(p[0]): float(p[1]) for p in curve.get("curve", [])}


def plot_bleu_curves(series: list[tuple[str, list[dict], str]], path: Path, title: str, xlabel: str) -> Path:
    """Validation BLEU against step, one line per (label, records, style) of ``series``: the mean over the records'
    seeds at the steps every seed evaluated, the range across seeds shaded. ``style`` "reference" draws black,
    "dashed" grey and dashed, "dashed-reference" black and dashed, anything else the next colour."""
    plt = pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    colours = plt.get_cmap("tab10").colors
    for i, (label, records, style) in enumerate(series):
        curves = [c for c in (bleu_curve(r) for r in records if r.get("status") == "complete") if c]
        if not curves:
            continue
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        ys = np.array([[c[x] for x in xs] for c in curves])
        colour = "black" if "reference" in style else "grey" if style == "dashed" else colours[i % 10]
        ax.plot(xs, ys.mean(0), marker=".", color=colour, linestyle="--" if "dashed" in style else "-",
                label=f"{label} ({len(curves)} seed{'s' * (len(curves) > 1)})")
        if len(curves) > 1:
            ax.fill_between(xs, ys.min(0), ys.max(0), color=colour, alpha=0.15, linewidth=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation BLEU (fixed subset)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, path, f"{title}: mean over seeds, range shaded")
