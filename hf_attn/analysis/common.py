"""Pieces every paper's analysis shares: the matplotlib setup, length buckets, Jensen-Shannon divergence, entropy,
Kendall's tau, BLEU by length bucket and decoding speed by length group.

    bucket_of(23, (20, 40))                  # 1: buckets (0, 20], (20, 40], (40, inf)
    bucket_labels((20, 40))                  # ["(0,20]", "(20,40]", "(40,inf)"]
    equal_count_groups([5, 1, 9, 3], 2)      # [[1, 3], [0, 2]]: indices, shortest group first
    jsd(p, q)                                # per row, nats: KL(p||m)/2 + KL(q||m)/2, m = (p + q)/2
    kendall_tau(x, y)                        # tau-b in [-1, 1]
    bleu_by_bucket(hyps, refs, lengths, (10, 20))
    speed_by_groups(model, tokenizer, groups)  # sentences/s per group of sources
"""

from __future__ import annotations

import time
from itertools import pairwise

import sacrebleu
import torch
from tqdm.auto import tqdm

from ..generation import translate_texts


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (the one setup every analysis plot uses)."""
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("the analysis plots need matplotlib: pip install matplotlib") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, title: str = ""):
    """Title, tight layout, write ``path`` (PNG at 120 dpi), close; returns ``path``."""
    plt = pyplot()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_series(series: dict, path, title: str, xlabel: str, ylabel: str, xticks: list | None = None):
    """One line per ``{label: (xs, ys)}`` on one axis; ``xticks`` labels the positions 0..n-1 (buckets)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=str(label))
    if xticks is not None:
        ax.set_xticks(range(len(xticks)), xticks, rotation=30, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def tokenized_batches(tokenizer, sources, targets, batch_size: int = 16, max_length: int = 128, progress: bool = False,
                      desc: str = "batches"):
    """Teacher-forcing batches ``{"input_ids", "attention_mask", "labels"}`` (padding in labels = -100), with a tqdm
    bar when ``progress``."""
    for start in tqdm(range(0, len(sources), batch_size), desc=desc, unit="batch", disable=not progress):
        enc = tokenizer(sources[start:start + batch_size], text_target=targets[start:start + batch_size],
                        padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        labels = enc["labels"].masked_fill(enc["labels"] == tokenizer.pad_token_id, -100)
        yield {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels}


# ---- length buckets ------------------------------------------------------------------------------------------------
def bucket_of(length: int, edges) -> int:
    """Index of the bucket (0, e0], (e0, e1], ..., (e_last, inf) that holds ``length``."""
    for i, edge in enumerate(edges):
        if length <= edge:
            return i
    return len(edges)


def bucket_labels(edges) -> list[str]:
    bounds = [0, *edges]
    return [f"({a},{b}]" for a, b in zip(bounds, edges)] + [f"({edges[-1]},inf)"]


def equal_count_groups(lengths, groups: int) -> list[list[int]]:
    """Indices sorted by length, cut into ``groups`` disjoint groups of (nearly) equal size, shortest first
    (ReLA paper Figure 2: "10 disjoint groups uniformly according to source length"). Empty groups are dropped."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    cuts = [round(k * len(order) / groups) for k in range(groups + 1)]
    return [order[a:b] for a, b in pairwise(cuts) if b > a]


def words(text: str) -> int:
    return len(text.split())


# ---- distributions --------------------------------------------------------------------------------------------------
def normalise(p: torch.Tensor) -> torch.Tensor:
    """Rows (last axis) clamped at 0 and rescaled to sum 1; an all-zero row stays all zero."""
    p = p.clamp(min=0).float()
    return p / p.sum(-1, keepdim=True).clamp(min=1e-12)


def row_entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy in nats, -sum_j p_j log p_j, of every row renormalised to sum 1."""
    p = normalise(p)
    return -(p * p.clamp(min=1e-12).log()).sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence per row, nats (Lin 1991; calibration paper Eq. 12):
    JSD(p, q) = KL(p || m) / 2 + KL(q || m) / 2 with m = (p + q) / 2; rows renormalised to sum 1 first."""
    p, q = normalise(p), normalise(q)
    m = (p + q) / 2

    def kl(a):
        return (a * (a.clamp(min=1e-12).log() - m.clamp(min=1e-12).log())).sum(-1)

    return kl(p) / 2 + kl(q) / 2


def kendall_tau(x, y) -> float:
    """Kendall's tau-b between two rankings of the same items:
    tau_b = sum_{i<j} sgn(x_i - x_j) sgn(y_i - y_j) / sqrt(n_x n_y), with n_x (n_y) the pairs not tied in x (y);
    1 = same order, -1 = reversed, 0 = unrelated (nan when either ranking is all ties)."""
    x, y = torch.as_tensor(x, dtype=torch.float64).flatten(), torch.as_tensor(y, dtype=torch.float64).flatten()
    sx, sy = (x[:, None] - x[None, :]).sign().triu(1), (y[:, None] - y[None, :]).sign().triu(1)
    denom = (sx.abs().sum() * sy.abs().sum()).sqrt()
    return float((sx * sy).sum() / denom) if denom > 0 else float("nan")


# ---- BLEU and speed by length -------------------------------------------------------------------------------------
def bleu_by_bucket(hypotheses, references, lengths, edges) -> list[dict]:
    """``[{"bucket", "sentences", "bleu"}]``: corpus BLEU (sacrebleu) of the pairs in each length bucket
    (buckets from `bucket_of`; an empty bucket has bleu None)."""
    out = []
    for b, label in enumerate(bucket_labels(edges)):
        idx = [i for i, n in enumerate(lengths) if bucket_of(n, edges) == b]
        bleu = sacrebleu.corpus_bleu([hypotheses[i] for i in idx], [[references[i] for i in idx]]).score if idx else None
        out.append({"bucket": label, "sentences": len(idx), "bleu": bleu})
    return out


def decoding_seconds(model, tokenizer, sources, batch_size: int = 1, num_beams: int = 1, max_length: int = 256) -> float:
    """Wall-clock seconds to translate ``sources`` (greedy unless ``num_beams`` > 1) in batches of ``batch_size``."""
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    translate_texts(model, tokenizer, list(sources), num_beams=num_beams, batch_size=batch_size,
                    max_source_length=max_length, progress=False)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def speed_by_groups(model, tokenizer, groups: dict, batch_size: int = 1, num_beams: int = 1, repeats: int = 1,
                    progress: bool = False) -> list[dict]:
    """``[{"group", "sentences", "mean_source_words", "seconds", "sentences_per_second"}]`` for ``{label: sources}``;
    ``seconds`` is the mean of ``repeats`` timed runs (the papers average 3)."""
    rows = []
    for label, sources in tqdm(groups.items(), desc="decoding speed", unit="group", disable=not progress):
        seconds = sum(decoding_seconds(model, tokenizer, sources, batch_size, num_beams) for _ in range(repeats)) / repeats
        rows.append({"group": label, "sentences": len(sources),
                     "mean_source_words": sum(map(words, sources)) / max(len(sources), 1),
                     "seconds": seconds, "sentences_per_second": len(sources) / max(seconds, 1e-9)})
    return rows
