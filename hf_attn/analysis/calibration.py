"""Attention calibration (Lu et al. 2021) as a saliency map: the masks of the mask-perturbation model.

The perturbation model learns to *remove* (small mask m, Eq. 4) the source tokens whose removal hurts the
translation most, so ``1 - m`` is the importance of source token j for the prediction of target token t, per
decoder layer and head (the paper's Figure 1 shows ``m`` beside the attention before and after calibration).

    sal = saliency_map(model, tokenizer, "Im Anfang war das Wort", "In the beginning was the Word")
    sal["mask"]        # [L, H, T, S] masks m of the calibrated layers (L = number of calibrated layers)
    sal["attention"]   # [L, H, T, S] original softmax attention a
    sal["combined"]    # [L, H, T, S] the weights the model attends with (a fused with a * exp(1 - m))
    sal["source_tokens"], sal["target_tokens"], sal["layers"]   # axis labels; decoder layer indices (0-based)
    plot_saliency(sal, "saliency.png", layer=-1)          # heatmap of 1 - m, mean over heads (or head=h)

    calibration_maps(model, input_ids, attention_mask, labels=...)   # batched: {layer: {"mask", ... [B,H,T,S]}}

Row t of every map is the decoder step that predicts target token t (teacher forcing on the given target).
"""

from __future__ import annotations

import math

import torch

from .common import bucket_labels, bucket_of, jsd, kendall_tau, pyplot, row_entropy, save_figure
from .stats import attention_details, collect_attentions, cross_attention_modules


def calibration_modules(model) -> dict[int, torch.nn.Module]:
    """``{decoder layer: calibrated cross-attention module}`` (also for a model loaded with remote code)."""
    return cross_attention_modules(model, "calibrated")


@torch.no_grad()
def calibration_maps(model, input_ids, attention_mask=None, labels=None, decoder_input_ids=None) -> dict[int, dict]:
    """One teacher-forced forward pass in eval mode; ``{layer: record}``, the model's ``attention_details`` of each
    calibrated layer (float32 [B,H,T,S]): attention (a), mask (m), calibrated (a * exp(1 - m)), combined (fused
    weights), gate ([B,H,T], gate fusion), plus ``source_mask`` [B, S] and ``target_mask`` [B, T] (True = real)."""
    if labels is None and decoder_input_ids is None:
        raise ValueError("calibration_maps needs labels or decoder_input_ids (the target the masks are computed for)")
    modules = calibration_modules(model)
    if not modules:
        raise ValueError(
            "this model has no calibrated cross-attention (cross_attention='calibrated', presets calibration-*); "
            f"its cross-attention layout is {model.config.attention_layout()['cross']}"
        )
    details = attention_details(model, input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                decoder_input_ids=decoder_input_ids)
    if labels is not None:
        target = labels.ne(-100)
    else:
        target = decoder_input_ids.ne(model.config.pad_token_id)
        target[:, 0] = True  # the decoder start token may equal pad (Marian)
    source = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    return {i: {**details[f"cross.{i}"], "source_mask": source, "target_mask": target} for i in modules}


def saliency_map(model, tokenizer, source: str, target: str) -> dict:
    """Masks and attention maps of one source/target pair, stacked over the calibrated layers: ``mask``,
    ``attention``, ``calibrated``, ``combined`` [L, H, T, S] (float32, cpu; ``gate`` [L, H, T] with gate fusion),
    ``layers`` (decoder layer indices), ``source_tokens`` (S), ``target_tokens`` (T)."""
    device = next(model.parameters()).device
    enc = tokenizer(source, text_target=target, return_tensors="pt")
    input_ids, labels = enc["input_ids"].to(device), enc["labels"].to(device)
    records = calibration_maps(model, input_ids, enc["attention_mask"].to(device), labels=labels)
    layers = sorted(records)
    out = {"layers": layers}
    for key in ("mask", "attention", "calibrated", "combined", "gate"):
        if key in records[layers[0]]:
            out[key] = torch.stack([records[i][key][0].float().cpu() for i in layers])
    out["source_tokens"] = tokenizer.convert_ids_to_tokens(input_ids[0].tolist())
    out["target_tokens"] = tokenizer.convert_ids_to_tokens(labels[0].tolist())
    return out


def plot_saliency(saliency: dict, path, layer: int = -1, head: int | None = None, values: str = "importance",
                  title: str = ""):
    """Heatmap of one calibrated layer (index into ``saliency["layers"]``, default the top one): rows = target
    tokens, columns = source tokens. ``values``: "importance" (1 - m, default), "mask" (m), "attention" (a),
    "combined" (the fused weights). ``head``: one head, or None for the mean over heads. Needs matplotlib."""
    choices = {"importance": "mask", "mask": "mask", "attention": "attention", "combined": "combined"}
    if values not in choices:
        raise ValueError(f"values={values!r} is not valid; choose one of {list(choices)}")
    plt = pyplot()

    data = saliency[choices[values]][layer]  # [H, T, S]
    data = data.mean(0) if head is None else data[head]
    if values == "importance":
        data = 1 - data
    src, tgt = saliency["source_tokens"], saliency["target_tokens"]
    fig, ax = plt.subplots(figsize=(0.45 * len(src) + 2.5, 0.4 * len(tgt) + 1.8))
    im = ax.imshow(data.numpy(), cmap="Reds" if values == "importance" else "Blues", aspect="auto", vmin=0)
    ax.set_xticks(range(len(src)), src, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(tgt)), tgt, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target (predicted token)")
    layer_idx = saliency["layers"][layer]
    heads = "mean over heads" if head is None else f"head {head}"
    label = {"importance": "1 - m", "mask": "m", "attention": "a", "combined": "fused weights"}[values]
    ax.set_title(title or f"decoder layer {layer_idx + 1}, {heads}: {label}", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    return save_figure(fig, path)


# ---- Figures 6 and 7, Table 5: how far calibration moves the attention -------------------------------------------
FIGURE7_EDGES = (0.8, 1.6, 2.4, 3.2)  # entropy of the original attention (nats): 0-0.8, ..., 3.2 and above


def calibration_statistics(model, batches, entropy_edges=FIGURE7_EDGES) -> dict:
    """Per calibrated decoder layer, over heads and real target tokens: ``jsd`` (Eq. 12) between the original
    attention a and the calibrated weights the model attends with (Figure 6); ``entropy_change`` =
    Ent(a) - Ent(calibrated) (Eq. 13, Table 5; > 0: calibration made the rows more focused); and, over all layers,
    the JSD per bucket of the original row's entropy (Figure 7). Rows are renormalised over the real source tokens."""
    labels = bucket_labels(entropy_edges)
    layer_sums: dict = {}
    buckets = torch.zeros(len(labels), 2, dtype=torch.float64)
    for batch in batches:
        for layer, rec in calibration_maps(model, **batch).items():
            src = rec["source_mask"][:, None, None, :]
            a, c = rec["attention"].float() * src, rec["combined"].float() * src
            live = rec["target_mask"][:, None, :].expand(a.shape[:-1])
            d, ent_a, ent_c = jsd(a, c)[live], row_entropy(a)[live], row_entropy(c)[live]
            acc = layer_sums.setdefault(layer, torch.zeros(4, dtype=torch.float64))
            acc += torch.tensor([float(d.sum()), float(ent_a.sum()), float(ent_c.sum()), float(live.sum())])
            idx = torch.tensor([bucket_of(float(e), entropy_edges) for e in ent_a])
            buckets.index_add_(0, idx, torch.stack([d.double(), torch.ones_like(d, dtype=torch.float64)], 1))
    layers = [{"layer": i, "jsd": float(s[0] / s[3]), "entropy_original": float(s[1] / s[3]),
               "entropy_calibrated": float(s[2] / s[3]), "entropy_change": float((s[1] - s[2]) / s[3])}
              for i, s in sorted(layer_sums.items())]
    total = sum(layer_sums.values())
    return {"layers": layers, "jsd": float(total[0] / total[3]), "entropy_change": float((total[1] - total[2]) / total[3]),
            "jsd_by_entropy": [{"bucket": lab, "rows": int(n), "jsd": float(s / n) if n else None}
                               for lab, (s, n) in zip(labels, buckets)]}


# ---- Figures 2 and 5: Kendall's tau against gradient importance ----------------------------------------------------
def gradient_importance(model, input_ids, attention_mask, labels) -> torch.Tensor:
    """tau_it = |d p(y_t | x) / d h_i| (Eq. 2; the L2 norm of the gradient with respect to the encoder output h_i)
    for one pair (batch of 1): ``[T, S]`` float32 on the CPU."""
    model.eval()
    with torch.enable_grad():
        h = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        h = h.detach().requires_grad_(True)
        logits = model(encoder_outputs=(h,), attention_mask=attention_mask, labels=labels).logits
        probs = logits.float().softmax(-1)[0].gather(-1, labels[0].clamp(min=0)[:, None]).squeeze(-1)
        rows = [torch.autograd.grad(probs[t], h, retain_graph=True)[0][0].norm(dim=-1) for t in range(probs.shape[0])]
    return torch.stack(rows).cpu()


def kendall_with_gradients(model, batches) -> dict:
    """Per decoder layer, the mean over target tokens of Kendall's tau between the ranking of the source tokens by
    gradient importance (`gradient_importance`) and by the head-averaged attention a (Figure 2), and, for calibrated
    layers, by the mask importance 1 - m (Figure 5: the masks rank the inputs closer to the gradients)."""
    calibrated = bool(calibration_modules(model))
    sums: dict = {}
    for batch in batches:
        for b in range(batch["input_ids"].shape[0]):
            one = {k: v[b:b + 1] for k, v in batch.items()}
            n_src, n_tgt = int(one["attention_mask"].sum()), int(one["labels"].ne(-100).sum())
            one = {"input_ids": one["input_ids"][:, :n_src], "attention_mask": one["attention_mask"][:, :n_src],
                   "labels": one["labels"][:, :n_tgt]}
            grad = gradient_importance(model, **one)
            maps = {("attention", i): w[0].mean(0) for i, w in enumerate(collect_attentions(model, **one)["cross"].weights)}
            if calibrated:
                maps.update({("mask", i): 1 - r["mask"][0].mean(0) for i, r in calibration_maps(model, **one).items()})
            for key, w in maps.items():
                taus = [kendall_tau(w[t], grad[t]) for t in range(n_tgt)]
                taus = [x for x in taus if not math.isnan(x)]  # nan: all ties (a one-token source)
                acc = sums.setdefault(key, [0.0, 0])
                acc[0], acc[1] = acc[0] + sum(taus), acc[1] + len(taus)
    out: dict = {"attention": [], "mask": []}
    for (kind, layer), (s, n) in sorted(sums.items()):
        out[kind].append({"layer": layer, "kendall_tau": s / n if n else None})
    return out
