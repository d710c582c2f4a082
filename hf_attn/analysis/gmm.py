"""What Gaussian-mixture cross-attention learned (Zhang & Feng 2021): gates and mixture parameters per layer.

The paper's Figure 5 is the distribution of the gate g_i (the share of the Gaussian mixture in the fused
attention, Eq. 13) in each decoder layer. Here:

    values = gate_values(model, batches)          # {layer: 1-D tensor of g over heads x real target tokens}
    mean_gate_per_layer(values)                  # {layer: mean g}
    gate_histograms(values, bins=20)             # {layer: (frequency, bin edges)}, Figure 5 as numbers
    plot_gate_distribution(values, "fig5.png")   # Figure 5 (needs matplotlib)
    gmm_parameters(model, **batch)               # {layer: {"gate", "weights", "mu", "sigma", "alpha", "beta", ...}}

Layers are 0-based decoder layer indices (the paper's L1..L6 are 0..5); only layers whose cross-attention is the
``gmm`` variant appear (see ``gmm_layer_subset``). Values come from teacher-forced forward passes.
"""

from __future__ import annotations

import torch

from .common import bucket_labels, bucket_of, pyplot, row_entropy, save_figure
from .stats import attention_details, collect_attentions, cross_attention_modules


def gmm_modules(model) -> dict[int, torch.nn.Module]:
    """``{decoder layer: GMM cross-attention module}`` of an hf-attn model (also one loaded with remote code)."""
    return cross_attention_modules(model, "gmm")


def _require_gmm(model) -> dict[int, torch.nn.Module]:
    modules = gmm_modules(model)
    if not modules:
        raise ValueError(
            "this model has no Gaussian-mixture cross-attention (cross_attention='gmm'); "
            f"its cross-attention layout is {model.config.attention_layout()['cross']}"
        )
    return modules


def _target_mask(model, labels, decoder_input_ids):
    """[B, T] True at real target positions (labels != -100, else decoder inputs that are not padding)."""
    if labels is not None:
        return labels.ne(-100)
    real = decoder_input_ids.ne(model.config.pad_token_id)
    real[:, 0] = True  # the decoder start token may equal pad (Marian)
    return real


@torch.no_grad()
def gmm_parameters(model, input_ids, attention_mask=None, labels=None, decoder_input_ids=None) -> dict[int, dict]:
    """One teacher-forced forward pass; ``{layer: record}``, the model's ``attention_details`` of each GMM layer:
    gate [B,H,T] (gate fusion only), weights / mu / sigma [B,H,T,K], source_length [B] (J), the attention maps
    alpha (dot-product), beta (mixture) and gamma (fused) [B,H,T,S], plus ``target_mask`` [B, T] (True = real
    target token) and ``source_mask`` [B, S]."""
    if labels is None and decoder_input_ids is None:
        raise ValueError("gmm_parameters needs labels or decoder_input_ids (the target the gates are computed for)")
    modules = _require_gmm(model)
    details = attention_details(model, input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                decoder_input_ids=decoder_input_ids)
    target = _target_mask(model, labels, decoder_input_ids)
    source = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    return {i: {**details[f"cross.{i}"], "target_mask": target, "source_mask": source} for i in modules}


def gate_values(model, batches) -> dict[int, torch.Tensor]:
    """``{layer: g}`` over every head and real target token of ``batches`` (dicts with input_ids, attention_mask,
    labels or decoder_input_ids), as one flat float tensor per layer: the data of the paper's Figure 5."""
    values: dict[int, list] = {}
    for batch in batches:
        keys = ("input_ids", "attention_mask", "labels", "decoder_input_ids")
        records = gmm_parameters(model, **{k: batch[k] for k in keys if batch.get(k) is not None})
        for layer, rec in records.items():
            if "gate" not in rec:
                raise ValueError(f"gmm_fusion={model.config.gmm_fusion!r} has no gate; gates exist with gmm_fusion='gate'")
            mask = rec["target_mask"].to(rec["gate"].device)[:, None, :].expand_as(rec["gate"])
            values.setdefault(layer, []).append(rec["gate"][mask].float().cpu())
    return {layer: torch.cat(v) for layer, v in values.items()}


def mean_gate_per_layer(values: dict[int, torch.Tensor]) -> dict[int, float]:
    """``{layer: mean g}``: > 0.5 = the layer leans on the Gaussian mixture, < 0.5 = on dot-product attention."""
    return {layer: v.mean().item() for layer, v in values.items()}


def gate_histograms(values: dict[int, torch.Tensor], bins: int = 20) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """``{layer: (frequency, edges)}``: share of gate values in each of ``bins`` equal bins of [0, 1]."""
    edges = torch.linspace(0, 1, bins + 1)
    out = {}
    for layer, v in values.items():
        counts = torch.histc(v.float().clamp(0, 1), bins=bins, min=0.0, max=1.0)
        out[layer] = (counts / counts.sum().clamp(min=1), edges)
    return out


def plot_gate_distribution(values: dict[int, torch.Tensor], path, bins: int = 20, title: str = ""):
    """The paper's Figure 5: one histogram of g per decoder layer (x: g, y: frequency). Needs matplotlib."""
    plt = pyplot()

    hists = gate_histograms(values, bins)
    fig, axes = plt.subplots(1, len(hists), figsize=(2.6 * len(hists), 2.6), squeeze=False, sharey=True)
    for ax, (layer, (freq, edges)) in zip(axes[0], sorted(hists.items())):
        ax.bar(edges[:-1].numpy(), freq.numpy(), width=1.0 / bins, align="edge", color="tab:blue", edgecolor="white")
        ax.axvline(values[layer].mean().item(), color="tab:red", lw=1)
        ax.set_title(f"L{layer + 1}  (mean {values[layer].mean().item():.2f})", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_xlabel("g")
    axes[0][0].set_ylabel("frequency")
    fig.suptitle(title or "gate g per decoder layer (share of the Gaussian mixture)", fontsize=10)
    return save_figure(fig, path)


# ---- Table 6: entropy of the mixture, dot-product and fused attention by source length -----------------------------
TABLE6_EDGES = (20, 40)  # Short (0,20], Mid [21,40], Long [41,inf) source tokens
TABLE6_MAPS = {"beta": "mixture", "alpha": "dot_product", "gamma": "fused"}  # GMA, DP, Total


def _maps(model, batch) -> list[tuple[dict, torch.Tensor, torch.Tensor]]:
    """``[({name: [B,H,T,S] map}, source mask, target mask)]`` per cross-attention layer: the three GMM maps of a
    GMM layer, the cross-attention (as ``attention``) of any other layer."""
    gmm = gmm_modules(model)
    out = []
    if gmm:
        for rec in gmm_parameters(model, **batch).values():
            maps = {name: rec[key] for key, name in TABLE6_MAPS.items() if key in rec}
            out.append((maps, rec["source_mask"], rec["target_mask"]))
    attn = collect_attentions(model, **batch)["cross"]
    target = batch["labels"].ne(-100)
    for i, w in enumerate(attn.weights):
        if i not in gmm:
            out.append(({"attention": w}, batch["attention_mask"].bool(), target))
    return out


def entropy_by_length(model, batches, edges=TABLE6_EDGES) -> dict:
    """The GMM paper's Table 6: mean row entropy (nats, rows renormalised over the real source tokens) of each map
    per source-length bucket (source tokens including EOS) and over all (``"all"``), averaged over cross-attention
    layers, heads and real target tokens: ``{map: {"all": x, "(0,20]": x, ...}}``."""
    labels = bucket_labels(edges)
    sums: dict = {}
    for batch in batches:
        for maps, src, tgt in _maps(model, batch):
            bucket = torch.tensor([bucket_of(int(n), edges) for n in src.sum(-1)])
            for name, w in maps.items():
                ent = row_entropy(w.float() * src[:, None, None, :])  # [B, H, T]
                live = tgt[:, None, :].expand_as(ent)
                acc = sums.setdefault(name, torch.zeros(len(labels), 2, dtype=torch.float64))
                for b in range(ent.shape[0]):
                    acc[bucket[b]] += torch.tensor([float(ent[b][live[b]].sum()), float(live[b].sum())])
    out = {}
    for name, acc in sums.items():
        total = acc.sum(0)
        out[name] = {"all": float(total[0] / total[1].clamp(min=1))}
        out[name].update({lab: (float(a / n) if n else None) for lab, (a, n) in zip(labels, acc)})
    return out
