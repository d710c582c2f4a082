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

from contextlib import contextmanager

import torch

from .common import pyplot, save_figure
from .stats import cross_attention_modules, recording


def calibration_modules(model) -> dict[int, torch.nn.Module]:
    """``{decoder layer: calibrated cross-attention module}`` (also for a model loaded with remote code)."""
    return cross_attention_modules(model, "calibrated")


@contextmanager
def record_calibration(model):
    """Within the block every calibrated module keeps its last maps in ``module.calibration_last`` (detached,
    float32 [B,H,T,S]): attention (a), mask (m), calibrated (a * exp(1 - m)), combined (fused weights), gate
    ([B,H,T], gate fusion); during training also the perturbed pass's perturbed / perturbed_mask /
    perturbed_attention."""
    modules = calibration_modules(model)
    if not modules:
        raise ValueError(
            "this model has no calibrated cross-attention (cross_attention='calibrated', presets calibration-*); "
            f"its cross-attention layout is {model.config.attention_layout()['cross']}"
        )
    with recording(modules, "calibration"):
        yield modules


@torch.no_grad()
def calibration_maps(model, input_ids, attention_mask=None, labels=None, decoder_input_ids=None) -> dict[int, dict]:
    """One teacher-forced forward pass in eval mode; ``{layer: record}`` with the maps of `record_calibration`
    plus ``source_mask`` [B, S] and ``target_mask`` [B, T] (True = real token)."""
    if labels is None and decoder_input_ids is None:
        raise ValueError("calibration_maps needs labels or decoder_input_ids (the target the masks are computed for)")
    was_training = model.training
    model.eval()
    try:
        with record_calibration(model) as modules:
            model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, decoder_input_ids=decoder_input_ids)
    finally:
        model.train(was_training)
    if labels is not None:
        target = labels.ne(-100)
    else:
        target = decoder_input_ids.ne(model.config.pad_token_id)
        target[:, 0] = True  # the decoder start token may equal pad (Marian)
    source = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    return {i: {**m.calibration_last, "source_mask": source, "target_mask": target} for i, m in modules.items()}


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
