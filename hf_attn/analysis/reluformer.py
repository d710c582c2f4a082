"""What ReLUFormer's attention learned, against any other model: the paper's statistics (Shen et al. 2023).

* entropy H(p) of each row renormalised to sum 1 (Section 4.2, Tables 3 and 5; null rows excluded), per site;
* top-p% score mass: the share of a row's (renormalised) weight held by its largest p% of entries (Section 3.4,
  Figures 2 and 4; higher = more centralised);
* sparsity and null rate (share of exact zeros / all-zero rows among visible entries), from `stats.layer_statistics`.

    python -m hf_attn.analysis.reluformer runs/softmax-300 runs/reluformer-300 --sentences 200 --output runs/x.json

computes them on the first ``--sentences`` test verses of the Bible pair (teacher forcing with the references).
"""

from __future__ import annotations

import argparse
import json

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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dirs", nargs="+", help="directories written by `hf-attn train`")
    p.add_argument("--sentences", type=int, default=200, help="first N verses of the Bible test split")
    p.add_argument("--source", default="e", help="Bible source translation code (default Elberfelder)")
    p.add_argument("--target", default="4", help="Bible target translation code (default World English Bible)")
    p.add_argument("--top-p", type=float, default=0.1)
    p.add_argument("--output", default=None, help="write the summaries as JSON here")
    args = p.parse_args(argv)
    from ..data import read_bible_pair
    from ..training.run import load_model_dir

    from ..data.bible import pair_keys, resolve_translation

    rows = read_bible_pair(args.source, args.target)["test"][: args.sentences]
    keys = pair_keys(resolve_translation(args.source), resolve_translation(args.target))
    sources = [r["translation"][keys[0]] for r in rows]
    references = [r["translation"][keys[1]] for r in rows]
    results = {}
    for d in args.model_dirs:
        model, tokenizer = load_model_dir(d)
        results[d] = attention_summary(model.eval(), tokenizer, sources, references, top_p=args.top_p)
        r = results[d]
        sites = ", ".join(f"{s} {r[s]['entropy']:.3f}" for s in ("encoder", "decoder", "cross") if s in r)
        print(f"{d}: mean entropy {r['mean_entropy']:.3f} nats ({sites}); top-{args.top_p:.0%} mass "
              + ", ".join(f"{s} {r[s]['top_p_mass']:.3f}" for s in ("encoder", "decoder", "cross") if s in r))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":  # pragma: no cover
    main()
