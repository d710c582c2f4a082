"""The checks behind the papers' claims (`claims.CLAIMS`): each reads the records of one group of runs (pooled over
seeds by `mean_record`, or a `SeedDelta` judged on the seed-aware interval) or a benchmark result, and returns whether
the claim holds and what we see."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from ..bench.results import STOCK, BenchSettings, SentenceRow
from ..modeling.hyperparameters import SITES  # the attention sites a run's analysis measures

@dataclass(frozen=True)
class SeedDelta:
    """A comparative check: ΔBLEU = ``a`` - ``b`` over a group's seeds, decided by ``holds(delta, ci)`` on the
    seed-aware 95% interval."""

    a: str
    b: str
    holds: Callable


def _site(r, site, stat):
    return r["analysis"]["attention"]["sites"].get(site, {}).get(stat)


def _bleu(r):
    return r["results"]["bleu"] if r["status"] == "complete" else None


def _mean_tree(values: list):
    """The mean of each number found at the same place in every one of ``values`` (nested dicts); anything else,
    or a number some lack, from the first."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _mean_tree([v[k] for v in values if isinstance(v, dict) and k in v]) for k in first}
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.mean(numbers) if len(numbers) == len(values) else first


def mean_record(records: list[dict]) -> dict:
    """One record standing for complete runs of the same preset and group: BLEU and every analysis figure averaged
    over them."""
    first = records[0]
    return {**first, "results": {**first["results"], "bleu": statistics.mean(r["results"]["bleu"] for r in records)},
            "analysis": _mean_tree([r["analysis"] for r in records])}


def _pooled(records: list[dict], failure_counts: bool) -> dict:
    """A preset's runs in a group as one record: a failed one where any failed and ``failure_counts`` (or none
    finished), else `mean_record` of the complete ones."""
    done = [r for r in records if r["status"] == "complete"]
    failed = [r for r in records if r["status"] != "complete"]
    return failed[0] if failed and (failure_counts or not done) else mean_record(done)


def _rela_sparse(runs):
    r = runs["rela-g"]
    sp = {s: _site(r, s, "sparsity") for s in SITES}
    nr = {s: _site(r, s, "null_rate") for s in SITES}
    holds = all(v is not None and v > 0.5 for v in sp.values()) and max(nr.values()) > 0
    return holds, ("sparsity " + ", ".join(f"{s} {v:.2f}" for s, v in sp.items()) +
                   "; null rate " + ", ".join(f"{s} {v:.3f}" for s, v in nr.items()))


def _fails(name, ref):
    def check(runs):
        r, b = runs[name], runs[ref]
        if r["status"] != "complete":
            return True, f"`{name}` did not finish: {r.get('error', r['status'])}"
        rb, bb = _bleu(r), _bleu(b)
        return (bb is not None and rb < 0.5 * bb), f"`{name}` BLEU {rb:.1f} vs `{ref}` {_fmt(bb)}"
    return check


def delta_ci(d: dict) -> str:
    """A bootstrap difference with its 95% interval, e.g. ``-4.0 [-4.7, -3.3]``."""
    return f"{d['delta']:+.1f} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]"


def _fmt(x):
    return "-" if x is None else f"{x:.1f}"


def _about_equal(name):
    return SeedDelta(name, "softmax", lambda delta, ci: abs(delta) <= 1.0 or ci[0] <= 0 <= ci[1])


def _not_worse(name):
    return SeedDelta(name, "softmax", lambda delta, ci: ci[1] >= 0)


def _better(name):
    return SeedDelta(name, "softmax", lambda delta, ci: ci[0] > 0)


def _gmm_gate(runs):
    g = runs["gmm"]["analysis"].get("gmm_gate") or {}
    vals = [g[k] for k in sorted(g, key=int)]
    holds = len(vals) > 1 and vals[0] > vals[-1]
    return holds, "mean gate per decoder layer " + ", ".join(f"L{i + 1} {v:.2f}" for i, v in enumerate(vals))


def _lower_entropy(name, sites):
    def check(runs):
        r, b = runs[name], runs["softmax"]
        pairs = {s: (_site(r, s, "entropy"), _site(b, s, "entropy")) for s in sites}
        holds = all(x is not None and y is not None and x < y for x, y in pairs.values())
        return holds, "; ".join(f"{s} {x:.2f} vs softmax {y:.2f} nats" for s, (x, y) in pairs.items())
    return check


def _lower_bleu(name, ref):
    """``name`` scores below ``ref``: the seed-aware interval of ΔBLEU lies below 0."""
    return SeedDelta(name, ref, lambda delta, ci: ci[1] < 0)


def _entropy_falls(name, ref, sites=SITES):
    def check(runs):
        pairs = {s: (_site(runs[name], s, "entropy"), _site(runs[ref], s, "entropy")) for s in sites}
        nulls = {s: _site(runs[name], s, "null_rate") for s in sites}
        holds = all(x is not None and y is not None and x < y for x, y in pairs.values())
        return holds, "; ".join(f"{s} {x:.2f} vs `{ref}` {y:.2f} nats (null rows {nulls[s]:.0%})"
                                for s, (x, y) in pairs.items())
    return check


def _mask_concentrates(runs):
    m = runs["calibration-gate"]["analysis"].get("calibration_mask") or {}
    removed = [v["removed_share"] for v in m.values()]
    top = [v["importance_top10_mass"] for v in m.values()]
    holds = bool(m) and max(removed) < 0.5 and min(top) >= 0.2
    return holds, ("share of source tokens removed (m < 0.5) per layer " + ", ".join(f"{x:.2f}" for x in removed) +
                   "; share of the importance 1 - m on the top 10% of tokens " + ", ".join(f"{x:.2f}" for x in top))


def _faster_decoding(name, also=(), margin=0.05):
    """From a `scripts/benchmark.py` result (``rows``: {preset: `SentenceRow`}, its `BenchSettings`): ``name``
    decodes more than ``margin`` (the benchmark's noise) faster than stock transformers with SDPA, median of
    interleaved rounds."""
    def check(rows: dict[str, SentenceRow], settings: BenchSettings):
        shown = [rows[p] for p in (name, *also) if p in rows]
        seen = ", ".join(f"`{r.preset}` {r.calls['decode'].ratio_vs_stock:.2f}x" for r in shown)
        soft = " / ".join(f"{r.calls['decode'].ratio_vs_softmax:.2f}x" for r in shown)
        share = rows[STOCK].calls["decode"].attention_share if STOCK in rows else None
        return rows[name].calls["decode"].ratio_vs_stock > 1 + margin, (
            f"{seen} stock SDPA's decoding speed ({soft} hf-attn softmax's); beam "
            f"{settings.beams}, {settings.decode_batch} x {settings.decode_len} tokens, median of "
            f"{settings.repeats} interleaved rounds"
            + (f"; stock spends {share:.0%} of a decoding call in SDPA" if share is not None else ""))
    return check


