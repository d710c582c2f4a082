"""What ReLUFormer's attention learned, against any other model: the paper's statistics (Shen et al. 2023).

* entropy H(p) of each row renormalised to sum 1 (Section 4.2, Tables 3 and 5; null rows excluded), per site;
* top-p% score mass: the share of a row's (renormalised) weight held by its largest p% of entries (Section 3.4,
  Figures 2 and 4; higher = more centralised);
* sparsity and null rate (share of exact zeros / all-zero rows among visible entries), from `stats.layer_statistics`.

    hf-attn analyze runs/softmax-300 runs/reluformer-300 --sentences 200 --output runs/x.json

computes them (and per-layer plots) on the first ``--sentences`` test pairs of each run (teacher forcing).
"""

from __future__ import annotations

import torch

from .stats import collect_attentions, layer_statistics


def top_p_mass(w: torch.Tensor, keep: torch.Tensor, p: float = 0.1) -> float:
    """Mean over live rows of the weight share of the top ``ceil(p * n)`` entries (n = visible keys of the row)."""
    keep = keep.expand_as(w)
    w = (w.clamp(min=0) * keep).float()
    total = w.sum(-1)
    live = keep.any(-1) & (total > 0)
    if not live.any():
        return float("nan")
    sorted_w = w.sort(-1, descending=True).values.cumsum(-1)
    k = (keep.sum(-1).float() * p).ceil().clamp(min=1).long()
    top = sorted_w.gather(-1, (k - 1).unsqueeze(-1)).squeeze(-1)
    return float((top / total.clamp(min=1e-12))[live].mean())


@torch.no_grad()
def attention_summary(model, tokenizer, sources, references, batch_size: int = 16, max_length: int = 128,
                      top_p: float = 0.1) -> dict:
    """``{site: {"entropy", "sparsity", "null_rate", "top_p_mass"}, "mean_entropy": ...}``, averaged over layers and
    batches (each batch weighted by its number of sentences)."""
    sums: dict = {}
    count = 0
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start : start + batch_size], text_target=references[start : start + batch_size],
                        padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        labels = enc["labels"].masked_fill(enc["labels"] == tokenizer.pad_token_id, -100)
        attn = collect_attentions(model, enc["input_ids"], enc["attention_mask"], labels=labels)
        stats = layer_statistics(attn)
        n = enc["input_ids"].shape[0]
        count += n
        for site, rows in stats.items():
            site_sums = sums.setdefault(site, {"entropy": 0.0, "sparsity": 0.0, "null_rate": 0.0, "top_p_mass": 0.0})
            for key in ("entropy", "sparsity", "null_rate"):
                site_sums[key] += n * sum(r[key] for r in rows) / len(rows)
            masses = [top_p_mass(w, attn[site].keep, top_p) for w in attn[site].weights]
            site_sums["top_p_mass"] += n * sum(masses) / len(masses)
    out = {site: {k: v / count for k, v in s.items()} for site, s in sums.items()}
    out["mean_entropy"] = sum(out[s]["entropy"] for s in sums) / len(sums)
    out["top_p"] = top_p
    out["sentences"] = count
    return out


def main(argv=None):
    """``python -m hf_attn.analysis.reluformer DIR ...`` = ``hf-attn analyze DIR ...`` (same flags)."""
    from .report import main as report_main

    return report_main(argv, prog="python -m hf_attn.analysis.reluformer")


if __name__ == "__main__":  # pragma: no cover
    main()
