"""The evidence behind a claim's explanation (`claims.Claim.evidence`, `claims.Claim.trend`): sentences computed
from the run records, group by group (per seed, by budget, the gap split into length and precision) or along a
preset's training (validation-loss gap, ΔBLEU by budget)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Callable

from ..modeling.hyperparameters import SITES
from .claim_checks import _bleu, _site, delta_ci, mean_record
from .columns import show_value
from .seeds import MIN_SEEDS, group_records, group_title

def _groups_with_flags(records: list[dict], train_args: tuple = ()):
    """(key, {preset: records}) of each group trained with exactly the extra flags ``train_args`` (none: the adopted
    recipe), in order."""
    return [(key, runs) for key, runs in sorted(group_records(records).items()) if key[-1] == tuple(train_args)]


def per_seed(preset: str, ref: str, sites=SITES, train_args: tuple = ()) -> Callable[[list[dict]], str]:
    """Evidence: one sentence per group (of the adopted recipe, or of an experiment's arm: ``train_args``) with
    complete runs of ``preset``, giving per seed its BLEU and entropy at each attention site (beside ``ref``'s of
    the same seed where the group has it), its share of null rows at each site and its source probe (validation
    loss with shuffled sources minus with the true ones; near 0 the model does not read the source)."""
    def sentences(records: list[dict]) -> str:
        out = []
        for key, runs in _groups_with_flags(records, train_args):
            refs = {r["spec"]["seed"]: r for r in runs.get(ref, []) if r["status"] == "complete"}
            seeds = []
            for r in (r for r in runs.get(preset, []) if r["status"] == "complete"):
                b = refs.get(r["spec"]["seed"])
                bleu = f"{_bleu(r):.1f}" + ("" if b is None else f" vs {_bleu(b):.1f}")
                ent = ", ".join(f"{s} {_site(r, s, 'entropy'):.2f}" + ("" if b is None else
                                f" vs {_site(b, s, 'entropy'):.2f}") for s in sites)
                probe = (r["analysis"].get("probe") or {}).get("gap")
                probe = None if probe is None else round(probe, 2) + 0.0  # no "-0.00"
                seeds.append(f"seed {r['spec']['seed']}: BLEU {bleu}, entropy {ent} nats, null rows " +
                             ", ".join(f"{s} {_site(r, s, 'null_rate'):.0%}" for s in sites) +
                             (f", source probe {probe:+.2f}" if probe is not None else ""))
            if seeds:
                against = f" against `{ref}`" if refs else ""
                out.append(f"Per seed, `{preset}`{against} ({group_title(key)}): {'; '.join(seeds)}.")
        return " ".join(out)
    return sentences


def _finished_by_seed(pools: dict) -> tuple[dict, list]:
    """``pools``: {preset: records}. Returns ({preset: {seed: its finished record}}, the seeds every preset has)."""
    done = {p: {r["spec"]["seed"]: r for r in rs if r["status"] == "complete"} for p, rs in pools.items()}
    return done, sorted(set.intersection(*(set(d) for d in done.values())))


def site_by_budget(preset: str, ref: str = "softmax", stat: str = "entropy",
                   sites=SITES) -> Callable[[list[dict]], str]:
    """Evidence: one sentence per (base, pair) where ``preset`` and ``ref`` share at least `MIN_SEEDS` complete
    seeds at two budgets or more (adopted recipe): ``stat`` at each attention site, ``preset``'s against ``ref``'s,
    each the mean over those seeds, budget by budget."""
    def sentences(records: list[dict]) -> str:
        by_setup = defaultdict(list)
        for key, runs in _groups_with_flags(records):
            done, shared = _finished_by_seed({p: runs.get(p, []) for p in (preset, ref)})
            if len(shared) < MIN_SEEDS:
                continue
            mean = {p: mean_record([done[p][s] for s in shared]) for p in (preset, ref)}
            pairs = ", ".join(f"{s} {_site(mean[preset], s, stat):.2f} vs {_site(mean[ref], s, stat):.2f}"
                              for s in sites)
            base, src, tgt, steps, _ = key
            by_setup[(base, src, tgt)].append(f"{steps:,} steps {pairs} (seeds {', '.join(map(str, shared))})")
        return " ".join(f"{stat.replace('_', ' ').capitalize()} of `{preset}` against `{ref}` by budget ({src}->{tgt}, "
                        f"{base}; mean over the seeds both have): {'; '.join(points)}."
                        for (base, src, tgt), points in sorted(by_setup.items()) if len(points) > 1)
    return sentences


def gap_by_group(preset: str, ref: str = "softmax", arms: tuple = ((),)) -> Callable[[list[dict]], str]:
    """Evidence: for each group of ``preset``'s runs (the adopted recipe's, or an arm's: each of ``arms`` is a tuple
    of extra flags) whose seeds include at least `MIN_SEEDS` that ``ref`` also has under the adopted recipe at the
    same base, pair and budget: the mean over those seeds of ΔBLEU, of each one's brevity penalty, and of ΔBLEU's
    precision part, BLEU / BP (sacrebleu's BLEU = BP x exp(mean log n-gram precision))."""
    def sentences(records: list[dict]) -> str:
        groups, parts = group_records(records), {}
        for flags in arms:
            for key, runs in _groups_with_flags(records, flags):
                done, shared = _finished_by_seed({preset: runs.get(preset, []),
                                                  ref: groups.get((*key[:-1], ()), {}).get(ref, [])})
                # (BLEU, BP) of each shared seed's run, per preset
                scores = {p: [(_bleu(done[p][s]), show_value(done[p][s], "bp")) for s in shared] for p in done}
                if len(shared) < MIN_SEEDS or not all(x for pairs in scores.values() for _, x in pairs):
                    continue
                bleu = {p: statistics.mean(b for b, _ in scores[p]) for p in done}
                bp = {p: statistics.mean(x for _, x in scores[p]) for p in done}
                precision = {p: statistics.mean(b / x for b, x in scores[p]) for p in done}
                parts[key] = (f"{group_title(key)}, seeds {', '.join(map(str, shared))}: ΔBLEU "
                              f"{bleu[preset] - bleu[ref]:+.1f}, BP {bp[preset]:.3f} vs {bp[ref]:.3f}, precision "
                              f"part (BLEU / BP) {precision[preset] - precision[ref]:+.1f}")
        ordered = [parts[k] for k in sorted(parts, key=lambda k: (k[1], k[2], k[0], k[3], k[4]))]  # pair, budget
        return (f"`{preset}` against `{ref}` group by group (means over the seeds both have): {'; '.join(ordered)}."
                if ordered else "")
    return sentences


def budget_trend(records: list[dict], sig: dict, preset: str) -> str:
    """One sentence per (pair, seed, base) with ``preset`` compared to softmax at two budgets or more: its ΔBLEU and
    95% interval at each, and whether the gap held (the longer budget's difference lies inside the shorter's
    interval), narrowed (outside, and smaller), widened (outside, larger, same sign) or reversed (outside, larger,
    the other sign). Empty when no setup has two budgets."""
    by_run = defaultdict(list)
    for r in records:
        spec = r["spec"]
        if spec["preset"] == preset and r["name"] in sig and not spec.get("train_args"):
            by_run[(spec["source"], spec["target"], spec["seed"], spec.get("base", "marian"))].append(
                (spec["steps"], sig[r["name"]]["bleu"]))
    sentences = []
    for (src, tgt, seed, base), points in sorted(by_run.items()):
        if len(points) < 2:
            continue
        points.sort(key=lambda p: p[0])
        (_, first), (_, last) = points[0], points[-1]
        lo, hi = first["ci"]
        if lo <= last["delta"] <= hi:
            verdict = "held (within the shorter run's interval)"
        elif abs(last["delta"]) < abs(first["delta"]):
            verdict = "narrowed"
        elif (last["delta"] < 0) != (first["delta"] < 0):  # e.g. +0.2 -> -1.0: larger, and the other way
            verdict = "reversed (changed sign and grew)"
        else:
            verdict = "widened"
        steps = ", ".join(f"{delta_ci(b)} at {n:,} steps" for n, b in points)
        sentences.append(f"ΔBLEU of `{preset}` against softmax by budget ({src}-{tgt}, seed {seed}, {base}): {steps}; "
                         f"with {points[-1][0] / points[0][0]:.0f}x the steps the gap {verdict}.")
    return " ".join(sentences)


def loss_gap(records: list[dict], preset: str) -> str:
    """One sentence per (pair, seed, base), from its longest run of ``preset`` with a softmax run of the same budget:
    the validation loss minus softmax's at the first evaluation, the step from which it stays above softmax's (or
    that it never stays above), its largest value and its value at the end. Empty without such a pair of runs."""
    runs = defaultdict(dict)
    for r in records:
        spec, curves = r["spec"], (r.get("results") or {}).get("curves") or {}
        if spec["preset"] in (preset, "softmax") and curves.get("validation_loss") and not spec.get("train_args"):
            key = (spec["source"], spec["target"], spec["seed"], spec.get("base", "marian"))
            runs[key].setdefault(spec["steps"], {})[spec["preset"]] = dict(map(tuple, curves["validation_loss"]))
    sentences = []
    for (src, tgt, seed, base), budgets in sorted(runs.items()):
        both = [n for n, pr in budgets.items() if len(pr) == 2]
        if not both:
            continue
        steps = max(both)
        mine, ref = budgets[steps][preset], budgets[steps]["softmax"]
        gap = [(k, mine[k] - ref[k]) for k in sorted(set(mine) & set(ref))]
        if len(gap) < 2:
            continue
        above = None
        for i in range(len(gap)):
            if all(d > 0 for _, d in gap[i:]):
                above = gap[i][0]
                break
        top = max(gap, key=lambda g: g[1])
        stays = (f"stays above softmax's from step {above:,} on" if above is not None else
                 "does not stay above softmax's")
        end = (f"largest at the end, {top[1]:+.2f} at step {top[0]:,}" if top[0] == gap[-1][0] else
               f"largest {top[1]:+.2f} (step {top[0]:,}), {gap[-1][1]:+.2f} at step {gap[-1][0]:,}")
        sentences.append(f"Validation loss of `{preset}` minus softmax's ({src}-{tgt}, seed {seed}, {base}, {steps:,} "
                         f"steps): {gap[0][1]:+.2f} at step {gap[0][0]:,}; it {stays}; {end}.")
    return " ".join(sentences)


