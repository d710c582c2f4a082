"""ReLA's null attention as a signal (Zhang, Titov & Sennrich 2021, Section 5.4 and Figure 6).

* `null_rate_shuffled`: null rate per layer and site on the test pairs and on the same pairs with the targets
  shuffled against their sources (Figure 6: solid vs dashed curves; hallucinated pairs get a higher cross-attention
  null rate).
* `sentence_null_rates` / `rank_by_null_rate`: the cross-attention null rate of every pair, ranked highest first,
  to flag likely mistranslated or misaligned pairs of a parallel corpus (not in the paper's tools).
* `shuffle_demo`: shuffle the targets of a known ``fraction`` of the pairs and count how many of them land in
  the top ``top`` share of the ranking.
"""

from __future__ import annotations

import math
import random

import torch

from .common import tokenized_batches
from .stats import attention_report, collect_attentions, null_rate


def derange(items: list, seed: int = 0) -> list:
    """A shuffled copy in which no item keeps its position (a random rotation of a random order), for >= 2 items."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    out = list(items)
    for a, b in zip(order, order[1:] + order[:1]):
        out[b] = items[a]
    return out


def shuffle_subset(targets: list, fraction: float, seed: int = 0) -> tuple[list, list[int]]:
    """``(targets with round(fraction * n) of them moved among themselves, sorted indices of the moved pairs)``."""
    k = max(2, round(fraction * len(targets)))
    chosen = sorted(random.Random(seed).sample(range(len(targets)), k))
    out = list(targets)
    for i, t in zip(chosen, derange([targets[i] for i in chosen], seed)):
        out[i] = t
    return out, chosen


def null_rate_shuffled(model, tokenizer, sources, targets, batch_size: int = 16, seed: int = 0) -> dict:
    """``{"original": {site: [null rate per layer]}, "shuffled": {...}}`` (mean over heads; Figure 6)."""
    out = {}
    for name, tgts in (("original", targets), ("shuffled", derange(targets, seed))):
        rep = attention_report(model, tokenizer, sources, tgts, batch_size=batch_size)
        out[name] = {site: [r["null_rate"] for r in rows] for site, rows in rep["layers"].items()}
    return out


@torch.no_grad()
def sentence_null_rates(model, tokenizer, sources, targets, batch_size: int = 16, max_length: int = 128,
                        progress: bool = False) -> list[float]:
    """Per pair: the share of (cross-attention layer, head, target token) rows that are all zero."""
    rates = []
    for batch in tokenized_batches(tokenizer, sources, targets, batch_size, max_length, progress, "null rate"):
        cross = collect_attentions(model, **batch)["cross"]
        per_layer = [torch.stack([null_rate(w[b:b + 1], cross.keep[b:b + 1]).mean() for b in range(w.shape[0])])
                     for w in cross.weights]
        rates.extend(torch.stack(per_layer).mean(0).tolist())
    return rates


def rank_by_null_rate(rates: list[float]) -> list[int]:
    """Pair indices, highest null rate (most suspicious) first; ties keep corpus order."""
    return sorted(range(len(rates)), key=lambda i: (-rates[i], i))


def top_share_hits(ranking: list[int], flagged, top: float = 0.1) -> int:
    """How many of ``flagged`` indices are among the first ``ceil(top * n)`` of ``ranking``."""
    k = math.ceil(round(top * len(ranking), 6))
    return len(set(ranking[:k]) & set(flagged))


def write_ranking(path, ranking, rates, sources, targets, flagged=()) -> None:
    """TSV ``rank, null_rate, index, shuffled (0/1), source, target``, most suspicious first."""
    flagged = set(flagged)
    with open(path, "w", encoding="utf-8") as f:
        f.write("rank\tnull_rate\tindex\tshuffled\tsource\ttarget\n")
        f.writelines(f"{r}\t{rates[i]:.4f}\t{i}\t{int(i in flagged)}\t{sources[i]}\t{targets[i]}\n"
                     for r, i in enumerate(ranking, 1))


def shuffle_demo(model, tokenizer, sources, targets, fraction: float = 0.05, top: float = 0.1, seed: int = 0,
                 batch_size: int = 16, progress: bool = False) -> dict:
    """Shuffle the targets of ``fraction`` of the pairs, rank all pairs by null rate, count the shuffled pairs in the
    top ``top`` share. ``expected_by_chance`` = shuffled x top."""
    shuffled_targets, moved = shuffle_subset(targets, fraction, seed)
    rates = sentence_null_rates(model, tokenizer, sources, shuffled_targets, batch_size, progress=progress)
    ranking = rank_by_null_rate(rates)
    hits = top_share_hits(ranking, moved, top)
    return {"pairs": len(sources), "shuffled": len(moved), "top": top, "shuffled_in_top": hits,
            "expected_by_chance": len(moved) * top, "shuffled_indices": moved, "ranking": ranking, "rates": rates,
            "targets": shuffled_targets}
