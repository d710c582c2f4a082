"""What the attention learned: sparsity rate, null rate, entropy, head diversity, alignment error.

Definitions follow the ReLA paper (Zhang, Titov & Sennrich 2021, Section 5):
  * sparsity rate: share of attention weights that are exactly 0 among the visible (query, key) pairs;
  * null rate: share of visible queries whose weights are all 0 (a head switched off for that query);
  * entropy: of each row renormalised to sum 1 (null rows excluded), in nats;
  * head diversity: generalised Jensen-Shannon divergence between the heads of a layer (Correia et al. 2019),
    JS = H(mean_h p_h) - mean_h H(p_h); ReLA's ReLU weights become distributions by softmax(w ** tau) (Section 5.2,
    Table 6), every other variant's rows are rescaled to sum 1; a null row is a one-hot distribution on a dummy
    slot (entropy 0);
  * AER (Och & Ney 2003): 1 - (|A & S| + |A & P|) / (|A| + |S|), with A the argmax alignment of the
    head-averaged attention of one layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..modeling.hyperparameters import SITES
from .common import pyplot, save_figure, tokenized_batches

LAYER_KEYS = ("sparsity", "null_rate", "entropy", "head_diversity")
SITE_OUTPUTS = {"encoder": "encoder_attentions", "decoder": "decoder_attentions", "cross": "cross_attentions"}


@dataclass
class SiteAttention:
    """Weights of every layer at one site, with the masks that say which entries are real."""

    weights: list[torch.Tensor]  # per layer [B, H, T, S]
    keep: torch.Tensor  # [B, 1, T, S] bool: the (query, key) pairs a query may see


def cross_attention_modules(model, variant: str) -> dict[int, torch.nn.Module]:
    """``{decoder layer: cross-attention module}`` of the layers whose cross-attention is ``variant`` (also for a
    model loaded with remote code)."""
    out = {}
    for i, layer in enumerate(model.model.decoder.layers):
        module = layer.encoder_attn
        if getattr(module, "variant", None) == variant:
            out[i] = module
    return out


@torch.no_grad()
def attention_details(model, **inputs) -> dict:
    """The variants' internal maps of one teacher-forced forward pass in eval mode (the model's
    ``attention_details`` output: ``{"site.layer": {name: tensor}}``)."""
    was_training = model.training
    model.eval()
    try:
        return model(**inputs, output_attention_details=True).attention_details
    finally:
        model.train(was_training)


@torch.no_grad()
def collect_attentions(model, input_ids, attention_mask, labels=None, decoder_input_ids=None) -> dict:
    """Run one teacher-forced forward pass and return ``{site: SiteAttention}`` for encoder/decoder/cross."""
    model.eval()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                decoder_input_ids=decoder_input_ids, output_attentions=True)
    if decoder_input_ids is None:
        decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels=labels.clamp(min=0))
    src_real = attention_mask.bool()
    tgt_real = decoder_input_ids.ne(model.config.pad_token_id)
    tgt_real[:, 0] = True  # the decoder start token may equal pad (Marian)
    if labels is not None:
        tgt_real &= labels.ne(-100)
    causal = torch.ones(tgt_real.shape[1], tgt_real.shape[1], dtype=torch.bool, device=tgt_real.device).tril()
    keeps = {
        "encoder": src_real[:, None, :, None] & src_real[:, None, None, :],
        "decoder": tgt_real[:, None, :, None] & tgt_real[:, None, None, :] & causal,
        "cross": tgt_real[:, None, :, None] & src_real[:, None, None, :],
    }
    return {
        site: SiteAttention([w.float() for w in getattr(out, name)], keeps[site])
        for site, name in SITE_OUTPUTS.items()
        if getattr(out, name, None)
    }


def _rows(w: torch.Tensor, keep: torch.Tensor):
    keep = keep.expand_as(w)
    valid_rows = keep.any(-1)  # [B, H, T]
    return w * keep, keep, valid_rows


def sparsity_rate(w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per head [H]: share of exactly-zero weights among visible pairs."""
    w, keep, _ = _rows(w, keep)
    zeros = ((w == 0) & keep).sum((0, 2, 3)).float()
    return zeros / keep.sum((0, 2, 3)).clamp(min=1)


def null_rows(w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """[B, H, T] bool: the visible queries whose whole row is zero (null attention)."""
    w, keep, valid = _rows(w, keep)
    return (w == 0).all(-1) & valid


def null_rate(w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per head [H]: share of visible queries whose whole row is zero."""
    valid = _rows(w, keep)[2]
    return null_rows(w, keep).sum((0, 2)).float() / valid.sum((0, 2)).clamp(min=1)


def entropy(w: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Per head [H]: mean entropy (nats) of the rows renormalised to sum 1; null rows excluded."""
    w, keep, valid = _rows(w.clamp(min=0), keep)
    total = w.sum(-1, keepdim=True)
    live = valid & (total.squeeze(-1) > 0)
    p = w / total.clamp(min=1e-12)
    h = -(p * p.clamp(min=1e-12).log()).sum(-1)
    return (h * live).sum((0, 2)) / live.sum((0, 2)).clamp(min=1)


def top_p_mass(w: torch.Tensor, keep: torch.Tensor, p: float = 0.1) -> float:
    """Top-p% score mass (ReLUFormer paper, Section 3.4, Figures 2 and 4): the mean over live rows of the weight
    share of the top ``ceil(p * n)`` entries (n = visible keys of the row; higher = more centralised)."""
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


def head_distributions(w: torch.Tensor, keep: torch.Tensor, tau: float = 1.0, relu_weights: bool = False) -> torch.Tensor:
    """Each visible row as a distribution over ``S + 1`` slots (the last one a dummy slot), for head diversity.

    ``relu_weights`` (ReLA, whose ReLU weights are not distributions): ``softmax(w ** tau)`` over the visible keys,
    as in the ReLA paper (Section 5.2 and Table 6: the weights raised to the temperature tau before the softmax, so
    a smaller tau gives a smoother distribution). Every other variant: each row rescaled to sum 1 (``tau`` does not
    apply). A row that is entirely zero (null attention) is one-hot on the dummy slot in both cases."""
    w, keep, _ = _rows(w.clamp(min=0), keep)
    null = (w == 0).all(-1, keepdim=True)  # [B, H, T, 1]
    if relu_weights:
        p = torch.softmax(w.pow(tau).masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    else:
        p = w / w.sum(-1, keepdim=True).clamp(min=1e-12)
    return torch.cat([p * ~null, null.float()], dim=-1)


def head_diversity(w: torch.Tensor, keep: torch.Tensor, tau: float = 1.0, relu_weights: bool = False) -> torch.Tensor:
    """Scalar: generalised Jensen-Shannon divergence between the heads of one layer (ReLA paper Section 5.2, after
    Correia et al. 2019), ``JS = H(mean_h p_h) - mean_h H(p_h)``, averaged over the visible queries; ``p_h`` from
    `head_distributions`."""
    valid = _rows(w, keep)[2]
    p = head_distributions(w, keep, tau, relu_weights)

    def ent(x):
        return -(x * x.clamp(min=1e-12).log()).sum(-1)

    js = ent(p.mean(1)) - ent(p).mean(1)  # [B, T]
    rows = valid.any(1)
    return (js * rows).sum() / rows.sum().clamp(min=1)


# variants whose weights are ReLU outputs that the ReLA paper turns into distributions with a softmax (Table 6)
RELU_WEIGHT_VARIANTS = ("rela",)


def layer_statistics(attn: dict, tau: float = 1.0, variants: dict | None = None) -> dict:
    """``{site: [{"layer", "sparsity", "null_rate", "entropy", "head_diversity", per-head lists}, ...]}``.

    ``variants``: ``{site: [variant name per layer]}`` (``config.attention_layout()``); it picks the head-diversity
    treatment of each layer (see `head_distributions`). Without it every layer is rescaled to sum 1."""
    out = {}
    for site, sa in attn.items():
        rows = []
        names = (variants or {}).get(site) or [None] * len(sa.weights)
        for i, w in enumerate(sa.weights):
            sp, nr, en = sparsity_rate(w, sa.keep), null_rate(w, sa.keep), entropy(w, sa.keep)
            relu_weights = names[i] in RELU_WEIGHT_VARIANTS
            rows.append(
                {
                    "layer": i,
                    "sparsity": sp.mean().item(),
                    "null_rate": nr.mean().item(),
                    "entropy": en.mean().item(),
                    "head_diversity": head_diversity(w, sa.keep, tau, relu_weights=relu_weights).item(),
                    "sparsity_per_head": sp.tolist(),
                    "null_rate_per_head": nr.tolist(),
                }
            )
        out[site] = rows
    return out


def alignment_from_attention(w: torch.Tensor, keep: torch.Tensor) -> set[tuple[int, int]]:
    """Argmax alignment {(source j, target i)} of one sentence's head-averaged cross-attention ``[H, T, S]``."""
    keep = keep.expand_as(w)
    mean = (w * keep).mean(0)
    rows = keep.any(0).any(-1)
    return {(int(mean[i].argmax()), i) for i in range(mean.shape[0]) if rows[i] and mean[i].max() > 0}


def alignment_error_rate(predicted: set, sure: set, possible: set | None = None) -> float:
    """AER = 1 - (|A & S| + |A & P|) / (|A| + |S|) (Och & Ney 2003); P includes S."""
    possible = set(possible or ()) | set(sure)
    if not predicted and not sure:
        return 0.0
    return 1.0 - (len(predicted & sure) + len(predicted & possible)) / (len(predicted) + len(sure))


def plot_layer_statistics(stats: dict, path, title: str = ""):
    """One panel per statistic, one line per site, layers on the x axis (like the ReLA paper's Figures 3 and 6)."""
    plt = pyplot()

    keys = LAYER_KEYS
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, key in zip(axes, keys):
        for site, rows in stats.items():
            ax.plot([r["layer"] + 1 for r in rows], [r[key] for r in rows], marker="o", label=site)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("layer")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_attention_heads(w: torch.Tensor, src_tokens, tgt_tokens, path, title: str = ""):
    """Heatmaps of one sentence's attention ``[H, T, S]``, one panel per head (null rows show as empty rows)."""
    plt = pyplot()

    heads = w.shape[0]
    fig, axes = plt.subplots(1, heads, figsize=(3.2 * heads, 0.25 * len(tgt_tokens) + 2), squeeze=False)
    for h, ax in enumerate(axes[0]):
        ax.imshow(w[h, : len(tgt_tokens), : len(src_tokens)].detach().float().cpu().numpy(), cmap="Blues", aspect="auto")
        ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(len(tgt_tokens)), tgt_tokens if h == 0 else [""] * len(tgt_tokens), fontsize=6)
        ax.set_title(f"head {h}")
    fig.suptitle(title)
    return save_figure(fig, path)


# ---- the attention report of `hf-attn analyze` and of each reproduce run -----------------------------------------
@torch.no_grad()
def attention_report(model, tokenizer, sources, references, batch_size: int = 16, max_length: int = 128,
                     top_p: float = 0.1, progress: bool = False, tau: float = 1.0) -> dict:
    """``{"layers": {site: [{"layer", "sparsity", "null_rate", "entropy", "head_diversity"}, ...]},
    "sites": {site: {...same keys..., "top_p_mass"}}, "sentences": N, "top_p": p}``: means over sentences (each
    batch weighted by its number of sentences); the site figures are the mean over its layers."""

    if not sources:
        raise ValueError("attention_report needs at least one sentence pair")
    layout = model.config.attention_layout() if hasattr(model.config, "attention_layout") else None
    layer_sums: dict = {}
    mass_sums: dict = {}
    count = 0
    for batch in tokenized_batches(tokenizer, sources, references, batch_size, max_length, progress,
                                   "attention statistics"):
        attn = collect_attentions(model, **batch)
        n = batch["input_ids"].shape[0]
        count += n
        for site, rows in layer_statistics(attn, tau, layout).items():
            sums = layer_sums.setdefault(site, [dict.fromkeys(LAYER_KEYS, 0.0) for _ in rows])
            for acc, row in zip(sums, rows):
                for k in LAYER_KEYS:
                    acc[k] += n * row[k]
            # layers whose rows are all null in this batch have no top-p mass (nan): leave them out
            masses = [m for m in (top_p_mass(w, attn[site].keep, top_p) for w in attn[site].weights) if m == m]
            if masses:
                acc = mass_sums.setdefault(site, [0.0, 0])
                acc[0] += n * sum(masses) / len(masses)
                acc[1] += n
    layers = {site: [{"layer": i, **{k: v / count for k, v in acc.items()}} for i, acc in enumerate(sums)]
              for site, sums in layer_sums.items()}
    sites = {site: {k: sum(r[k] for r in rows) / len(rows) for k in LAYER_KEYS} for site, rows in layers.items()}
    for site, figures in sites.items():
        total, weight = mass_sums.get(site, (0.0, 0))
        figures["top_p_mass"] = total / weight if weight else None  # None: every row null
    return {"layers": layers, "sites": sites, "sentences": count, "top_p": top_p, "tau": tau}


def format_report(name: str, report: dict) -> str:
    """One line per site: ``name  site  sparsity  null rate  entropy  head diversity  top-p mass``."""
    lines = []
    for site in SITES:
        if site in report["sites"]:
            r = report["sites"][site]
            mass = "-" if r["top_p_mass"] is None else f"{r['top_p_mass']:.3f}"
            lines.append(f"{name:<28} {site:<8} {r['sparsity']:>8.3f} {r['null_rate']:>9.3f} {r['entropy']:>8.3f} "
                         f"{r['head_diversity']:>9.3f} {mass:>9}")
    return "\n".join(lines)
