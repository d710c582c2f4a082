"""Seed-aware statistics: runs grouped across training seeds, and a bootstrap that resamples the seeds too.

A single training run says little about a method: at 600 steps on the Bible the BLEU of `softmax` alone moves by
about 0.6 (standard deviation over seeds 42-44), and `rela-g`'s by 1.4, so a paired bootstrap over the test
sentences of one seed (`tables.paired_bootstrap`) measures the test set's noise, not the training's. A *group* is
every run of one configuration (base, pair, budget, extra train flags) whatever its seed; two presets of a group are
compared with `seed_bootstrap`, which resamples the sentences and the seeds together.
"""

from __future__ import annotations

import functools
import hashlib
import statistics
from collections import defaultdict

import numpy as np
from sacrebleu.metrics import BLEU, CHRF

from ..errors import HfAttnInputError

MIN_SEEDS = 3  # seeds per preset before a comparison gets a verdict


# -------------------------------------------------------------------------------------------------- groups
def group_key(spec: dict) -> tuple:
    """What a run shares with its other seeds: (base, source, target, steps, extra train flags)."""
    return (spec.get("base", "marian"), spec["source"], spec["target"], spec["steps"],
            tuple(spec.get("train_args") or ()))


def group_name(key: tuple) -> str:
    """A file-name-safe id of a group, a run's setup without its seed (e.g. ``de-en_600steps``)."""
    base, source, target, steps, train_args = key
    extra = f"_x{hashlib.sha1(' '.join(train_args).encode()).hexdigest()[:6]}" if train_args else ""
    return f"{'' if base == 'marian' else base + '_'}{source}-{target}_{steps}steps{extra}"


def group_title(key: tuple) -> str:
    base, source, target, steps, train_args = key
    return f"{source}->{target}, {steps} steps, {base}" + (f", flags `{' '.join(train_args)}`" if train_args else "")


def group_records(records: list[dict]) -> dict:
    """``{group key: {preset: [records, by seed]}}`` of every record, failed ones included."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        groups[group_key(r["spec"])][r["spec"]["preset"]].append(r)
    for runs in groups.values():
        for rs in runs.values():
            rs.sort(key=lambda r: r["spec"]["seed"])
    return groups


def complete(records: list[dict]) -> list[dict]:
    """The records that finished and have their test translations."""
    return [r for r in records if r["status"] == "complete" and r.get("hypotheses")]


def seed_delta(a: list[dict], b: list[dict], seed_cmp) -> tuple[dict | None, str]:
    """The seed-aware comparison of runs ``a`` against runs ``b`` (any status), or why there is none:
    ``(result, "")``, ``(None, "not run yet")`` or ``(None, "not enough seeds (n=...)")``."""
    if not a or not b:
        return None, "not run yet"
    done_a, done_b = complete(a), complete(b)
    n = min(len(done_a), len(done_b))
    if n < MIN_SEEDS:
        return None, f"not enough seeds (n={n})"
    return seed_cmp(done_a, done_b), ""


# -------------------------------------------------------------------------------------------------- text
def sd(values: list[float]) -> float | None:
    """Sample standard deviation; None for fewer than two values."""
    return statistics.stdev(values) if len(values) > 1 else None


def mean_sd(values: list[float], spec: str = ".1f") -> str:
    """``13.8 ± 0.6`` (one value: just the value; none: ``-``)."""
    if not values:
        return "-"
    s = sd(values)
    return format(statistics.mean(values), spec) + ("" if s is None else f" ± {format(s, spec)}")


def p_text(p: float) -> str:
    """A p-value for a table: ``0.012``, or ``< 0.001`` when no resample crossed 0."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


# -------------------------------------------------------------------------------------------------- bootstrap
@functools.lru_cache(maxsize=16)
def scorer(name: str, references: tuple):
    """sacrebleu's ``name`` ("bleu" or "chrf", default settings as the records' scores) with ``references``
    preprocessed once."""
    return {"bleu": BLEU, "chrf": CHRF}[name](references=[list(references)])


@functools.lru_cache(maxsize=512)
def _run_stats(name: str, hypotheses: tuple, references: tuple) -> np.ndarray:
    stats = np.asarray(scorer(name, references)._extract_corpus_statistics(list(hypotheses), None), dtype=np.int64)
    stats.flags.writeable = False
    return stats


def run_stats(name: str, hypotheses: list[str], references: list[str]) -> np.ndarray:
    """sacrebleu's sufficient statistics of each sentence of one run (sentences x statistics, integers, read-only);
    cached, as the report compares a run with several others."""
    return _run_stats(name, tuple(hypotheses), tuple(references))


def corpus_score(metric, summed: np.ndarray) -> float:
    """The corpus score of summed (or weighted-summed) sufficient statistics."""
    return metric._compute_score_from_stats(summed.tolist()).score


@functools.lru_cache(maxsize=8)
def _sentence_weights(n: int, n_samples: int, seed: int) -> np.ndarray:
    """How many times each resample draws each of ``n`` test sentences (resamples x sentences): the first draw of
    ``numpy.random.default_rng(seed)``, as `seed_bootstrap` makes it."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_samples, n)) + n * np.arange(n_samples)[:, None]
    weights = np.bincount(idx.ravel(), minlength=n_samples * n).reshape(n_samples, n)
    weights.flags.writeable = False
    return weights


@functools.lru_cache(maxsize=1024)
def _run_resampled(name: str, hypotheses: tuple, references: tuple, n_samples: int, seed: int) -> np.ndarray:
    """One run's corpus score on each resample's drawn sentences; cached, as the report compares a run (a softmax
    seed above all) with many others on the same draws."""
    metric = scorer(name, references)
    weights = _sentence_weights(len(references), n_samples, seed)
    scores = np.array([corpus_score(metric, row) for row in weights @ _run_stats(name, hypotheses, references)])
    scores.flags.writeable = False
    return scores


def _resampled_scores(name, runs, references: tuple, draws: np.ndarray, seed: int) -> np.ndarray:
    """Per resample: the mean, over that resample's drawn seeds, of each seed's score on its drawn sentences."""
    per_run = np.stack([_run_resampled(name, tuple(h), references, len(draws), seed) for h in runs], axis=1)
    return np.take_along_axis(per_run, draws, axis=1).mean(axis=1)  # per_run: resamples x seeds


def _compare(name, a_runs, b_runs, references, draws_a, draws_b, seed) -> dict:
    metric, references = scorer(name, tuple(references)), tuple(references)
    full_a = [corpus_score(metric, run_stats(name, h, references).sum(0)) for h in a_runs]
    full_b = [corpus_score(metric, run_stats(name, h, references).sum(0)) for h in b_runs]
    deltas = (_resampled_scores(name, a_runs, references, draws_a, seed)
              - _resampled_scores(name, b_runs, references, draws_b, seed))
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    p = min(1.0, 2 * min(float((deltas <= 0).mean()), float((deltas >= 0).mean())))
    sd_a, sd_b = sd(full_a), sd(full_b)
    return {"a": round(statistics.mean(full_a), 2), "b": round(statistics.mean(full_b), 2),
            "sd_a": None if sd_a is None else round(sd_a, 2), "sd_b": None if sd_b is None else round(sd_b, 2),
            "delta": round(statistics.mean(full_a) - statistics.mean(full_b), 2),
            "ci": [round(float(lo), 2), round(float(hi), 2)], "p_value": round(p, 4),
            "n_a": len(a_runs), "n_b": len(b_runs)}


def _check_runs(a_runs: list, b_runs: list, references: list[str]) -> None:
    if not a_runs or not b_runs:
        raise HfAttnInputError(f"seed bootstrap: need at least one run of each system ({len(a_runs)}, {len(b_runs)})")
    lengths = sorted({len(h) for h in [*a_runs, *b_runs]})
    if lengths != [len(references)]:
        raise HfAttnInputError(f"seed bootstrap: every run needs one translation per reference ({len(references)}); "
                               f"got {', '.join(map(str, lengths))}")


def seed_bootstrap(a_runs: list[list[str]], b_runs: list[list[str]], references: list[str], n_samples: int = 1000,
                   seed: int = 12345) -> dict:
    """System a against system b, each given as its runs' test translations (one list per training seed), on BLEU
    and chrF: ``{metric: {"a", "b", "sd_a", "sd_b", "delta", "ci", "p_value", "n_a", "n_b"}}``.

    ``a`` and ``b`` are the means over seeds of the corpus scores on the whole test set, ``sd_*`` the standard
    deviations across seeds (None for one seed), ``delta`` = a - b. Two-level bootstrap: each of the ``n_samples``
    resamples draws test sentences with replacement (the same draw for both systems, so sentences stay paired) and,
    for each system, its seeds with replacement; a system's resampled score is the mean over its drawn seeds of the
    corpus score on the drawn sentences (from sacrebleu's sufficient statistics, summed with the draw's counts as
    weights). ``ci`` is the 95% percentile interval of the resampled deltas, ``p_value`` two-sided: twice the smaller
    share of resampled deltas on either side of 0 (at most 1). One seed per system reduces it to a paired bootstrap
    over sentences.

    Resampling k seeds with replacement gives the mean over seeds a variance of (k - 1) / k times the usual estimate
    s^2 / k: with 3 seeds the interval underestimates the seed variance somewhat (two thirds of it, about 18% on the
    seed part of its width). Deterministic: the draws come from ``numpy.random.default_rng(seed)``.
    """
    _check_runs(a_runs, b_runs, references)
    rng = np.random.default_rng(seed)
    rng.integers(0, len(references), size=(n_samples, len(references)))  # the sentences' draw (`_sentence_weights`)
    draws_a = rng.integers(0, len(a_runs), size=(n_samples, len(a_runs)))  # then each system's seeds
    draws_b = rng.integers(0, len(b_runs), size=(n_samples, len(b_runs)))
    return {name: _compare(name, a_runs, b_runs, references, draws_a, draws_b, seed) for name in ("bleu", "chrf")}
