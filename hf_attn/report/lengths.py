"""BLEU by source length: the test sentences of a group bucketed by source words, its table and its plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..analysis.common import bucket_labels, bucket_of, words
from ..errors import HfAttnInputError
from .columns import fmt, mean_of
from .plots import plot_bleu_by_length
from .records import shared_references, sources_for
from .seeds import complete, corpus_score, run_stats, scorer


LENGTH_EDGES = (10, 20, 30)  # source words; Bible verses (John) run 3-54 words, median 20, 12% over 30


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
            bleu[p] = [mean_of(corpus_score(metric, s[bucket == b].sum(0)) for s in stats) if counts[b] else None
                       for b in range(len(labels))]
    return {"buckets": labels, "sentences": counts, "bleu": bleu}


def length_table(data: dict) -> list[str]:
    head = " | ".join(f"{b} words ({n})" for b, n in zip(data["buckets"], data["sentences"]))
    lines = [f"| preset | {head} |", "|---|" + "---|" * len(data["buckets"])]
    return lines + [f"| {p} | " + " | ".join(fmt(v) for v in vals) + " |" for p, vals in data["bleu"].items()]


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
