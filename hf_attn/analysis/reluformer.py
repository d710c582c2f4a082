"""What ReLUFormer's attention learned, against any other model: the paper's statistics (Shen et al. 2023).

* entropy H(p) of each row renormalised to sum 1 (Section 4.2, Tables 3 and 5; null rows excluded), per site;
* top-p% score mass: the share of a row's (renormalised) weight held by its largest p% of entries (Section 3.4,
  Figures 2 and 4; higher = more centralised);
* sparsity and null rate (share of exact zeros / all-zero rows among visible entries), from `stats.layer_statistics`.

    hf-attn analyze runs/softmax-300 runs/reluformer-300 --sentences 200 --output runs/x.json

computes them (and per-layer plots) on the first ``--sentences`` test pairs of each run (teacher forcing);
``--figures reluformer-layers,reluformer-long`` adds them per layer for several p, and on long inputs built by joining
consecutive pairs up to ``--long_lengths`` tokens (Tables 3 and 5, Figures 2 and 4; see `long_documents`).
"""

from __future__ import annotations

import torch

from .stats import attention_report, collect_attentions, layer_statistics, top_p_mass


def attention_summary(model, tokenizer, sources, references, batch_size: int = 16, max_length: int = 128,
                      top_p: float = 0.1) -> dict:
    """``{site: {"entropy", "sparsity", "null_rate", "top_p_mass"}, "mean_entropy", "top_p", "sentences"}``: the
    site figures of `stats.attention_report` (means over layers and sentences) and their mean entropy."""
    rep = attention_report(model, tokenizer, sources, references, batch_size, max_length, top_p)
    keys = ("entropy", "sparsity", "null_rate", "top_p_mass")
    out = {site: {k: figures[k] for k in keys} for site, figures in rep["sites"].items()}
    out["mean_entropy"] = sum(out[s]["entropy"] for s in rep["sites"]) / len(rep["sites"])
    return {**out, "top_p": top_p, "sentences": rep["sentences"]}


TOP_P_VALUES = (0.005, 0.01, 0.015, 0.05, 0.1)  # Figure 4 shows up to the top 1.5%; Figure 2 wider shares


@torch.no_grad()
def layer_entropy_and_mass(model, batches, top_p_values=TOP_P_VALUES) -> dict:
    """``{site: [{"layer", "entropy", "top_p_mass": {p: mass}}]}``: the paper's entropy H(s) (Table 3) and top-p%
    score sums (Section 3.4, Figures 2 and 4) per layer, averaged over batches weighted by sentences."""
    sums: dict = {}
    count = 0
    for batch in batches:
        attn = collect_attentions(model, **batch)
        n = batch["input_ids"].shape[0]
        count += n
        for site, rows in layer_statistics(attn).items():
            acc = sums.setdefault(site, [[0.0] * (1 + len(top_p_values)) for _ in rows])
            for i, (row, w) in enumerate(zip(rows, attn[site].weights)):
                values = [row["entropy"], *(top_p_mass(w, attn[site].keep, p) for p in top_p_values)]
                acc[i] = [a + n * v for a, v in zip(acc[i], values)]
    return {site: [{"layer": i, "entropy": a[0] / count,
                    "top_p_mass": {str(p): m / count for p, m in zip(top_p_values, a[1:])}} for i, a in enumerate(rows)]
            for site, rows in sums.items()}


def long_documents(tokenizer, sources, targets, limit: int) -> tuple[list[str], list[str]]:
    """The paper's long inputs (Appendix B): consecutive pairs joined into one document while the source stays within
    ``limit`` tokens (sum l_1..l_m <= L < sum l_1..l_m+1); the next document starts with the pair that did not fit.
    A single pair longer than ``limit`` is a document of its own (truncated when encoded)."""
    docs_src, docs_tgt, cur_src, cur_tgt, used = [], [], [], [], 0
    for s, t in zip(sources, targets):
        n = len(tokenizer(s, add_special_tokens=False)["input_ids"])
        if cur_src and used + n > limit:
            docs_src.append(" ".join(cur_src))
            docs_tgt.append(" ".join(cur_tgt))
            cur_src, cur_tgt, used = [], [], 0
        cur_src.append(s)
        cur_tgt.append(t)
        used += n
    if cur_src:
        docs_src.append(" ".join(cur_src))
        docs_tgt.append(" ".join(cur_tgt))
    return docs_src, docs_tgt
