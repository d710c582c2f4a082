"""What RAN learned: the input-independent attention matrices of every layer (Zeng et al. 2021, Figure 6).

RAN's weights depend on positions only, so they can be read straight from the parameters: layer l of a stack
attends with ``softmax(A_l[:n, :n])`` on an input of n tokens (A_l = A_{l-1} + Rec(A_{l-1}); the decoder keeps
the lower triangle). The random Synthesizer baseline (``synthesizer``) has one such matrix per layer and is
covered too, so the two can be compared as in the paper's Figures 4-7.

    mats = learned_attention(model, length=30)        # {"encoder": {layer: [H, 30, 30]}, "decoder": {...}}
    plot_attention_heatmaps(mats, "fig6.png")         # Figure 6: one heatmap per layer (mean over heads)
    plot_attention_heatmaps(mats, "fig6_h0.png", head=0)
    attention_entropy(mats)                           # {"encoder": {layer: mean row entropy}, ...} (Figure 4)

Layers are 0-based layer indices of the stack; only RAN / Synthesizer self-attention layers appear. Works on any
hf-attn model, including one loaded with ``trust_remote_code``.
"""

from __future__ import annotations

import torch

from .common import jsd, pyplot, save_figure
from .stats import collect_attentions

LEARNED_VARIANTS = ("recurrent", "synthesizer")


def learned_modules(model) -> dict[str, dict[int, torch.nn.Module]]:
    """``{site: {layer: self-attention module}}`` for every RAN / Synthesizer layer of an hf-attn model."""
    out = {}
    for site, stack in (("encoder", model.model.encoder), ("decoder", model.model.decoder)):
        found = {
            i: layer.self_attn
            for i, layer in enumerate(stack.layers)
            if getattr(layer.self_attn, "variant", None) in LEARNED_VARIANTS
        }
        if found:
            out[site] = found
    return out


@torch.no_grad()
def learned_attention(model, length: int | None = None, normalize: bool = True) -> dict[str, dict[int, torch.Tensor]]:
    """Each RAN / Synthesizer layer's attention on an input of ``length`` tokens (default: the matrices' full
    size, ``ran_max_positions``): ``{site: {layer: float32 [H, length, length]}}`` on the CPU.

    ``normalize=True`` gives the attention distributions the layer uses (softmax over keys, decoder rows masked
    causally: exact zeros above the diagonal); ``normalize=False`` the raw logits A_l.
    """
    modules = learned_modules(model)
    if not modules:
        layout = model.config.attention_layout()
        raise ValueError(
            "this model has no RAN or Synthesizer self-attention layer (encoder/decoder_attention='recurrent' or "
            f"'synthesizer'); its layout is encoder={layout['encoder']}, decoder={layout['decoder']}"
        )
    out = {}
    for site, layers in modules.items():
        out[site] = {}
        for i, module in layers.items():
            logits = module.layer_matrix(length).float().cpu()
            if normalize:
                if site == "decoder":
                    n = logits.shape[-1]
                    causal = torch.ones(n, n, dtype=torch.bool).tril()
                    logits = logits.masked_fill(~causal, float("-inf"))
                logits = torch.softmax(logits, dim=-1)
            out[site][i] = logits
    return out


def attention_entropy(matrices: dict[str, dict[int, torch.Tensor]]) -> dict[str, dict[int, float]]:
    """Mean over heads and query rows of the attention entropy -sum_j p log p (the paper's Eq. 5 / Figure 4).

    ``matrices`` from `learned_attention` with ``normalize=True``.
    """
    out = {}
    for site, layers in matrices.items():
        out[site] = {}
        for i, p in layers.items():
            ent = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
            out[site][i] = float(ent.mean())
    return out


def plot_attention_heatmaps(
    matrices: dict[str, dict[int, torch.Tensor]],
    path: str,
    head: int | None = None,
    max_positions: int | None = 40,
    title: str | None = None,
) -> str:
    """The paper's Figure 6: one heatmap per layer (rows: encoder, decoder; columns: layers), x = key position,
    y = query position. ``head=None`` averages the heads; ``max_positions`` crops the matrices (None: full size).
    Writes ``path`` (any format matplotlib knows) and returns it. Needs matplotlib."""
    plt = pyplot()
    sites = [s for s in ("encoder", "decoder") if s in matrices]
    if not sites:
        raise ValueError("no matrices to plot: pass the output of learned_attention(model)")
    cols = max(len(matrices[s]) for s in sites)
    fig, axes = plt.subplots(len(sites), cols, figsize=(2.6 * cols, 2.6 * len(sites)), squeeze=False)
    for r, site in enumerate(sites):
        for c in range(cols):
            ax = axes[r][c]
            layers = sorted(matrices[site])
            if c >= len(layers):
                ax.axis("off")
                continue
            m = matrices[site][layers[c]]
            if head is not None and not -m.shape[0] <= head < m.shape[0]:
                raise ValueError(f"head={head} is out of range: the matrices have {m.shape[0]} heads")
            img = m.mean(0) if head is None else m[head]
            if max_positions is not None:
                img = img[:max_positions, :max_positions]
            ax.imshow(img.numpy(), cmap="viridis", aspect="equal", interpolation="nearest")
            ax.set_title(f"{site} layer {layers[c]}", fontsize=9)
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query position", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(title or ("mean over heads" if head is None else f"head {head}"), fontsize=10)
    return save_figure(fig, path)


# ---- Figures 5 and 7: weight histograms and JSD between layers, from the attention on real inputs ------------------
def weight_histograms(model, batches, bins: int = 20) -> dict:
    """The RAN paper's Figure 5 as numbers: ``{site: {layer: share of the visible attention weights in each of
    ``bins`` equal bins of [0, 1]}}`` (any model: the weights it attends with on the given pairs)."""
    counts: dict = {}
    for batch in batches:
        for site, sa in collect_attentions(model, **batch).items():
            for i, w in enumerate(sa.weights):
                values = w[sa.keep.expand_as(w)].clamp(0, 1)
                acc = counts.setdefault(site, {}).setdefault(i, torch.zeros(bins))
                acc += torch.histc(values, bins=bins, min=0.0, max=1.0)
    return {site: {i: (c / c.sum().clamp(min=1)).tolist() for i, c in layers.items()} for site, layers in counts.items()}


def layer_pair_jsd(model, batches) -> dict:
    """The RAN paper's Figure 7: ``{site: L x L matrix}`` of the mean Jensen-Shannon divergence between the
    head-averaged attention rows of every pair of layers (over the visible query rows)."""
    sums: dict = {}
    for batch in batches:
        for site, sa in collect_attentions(model, **batch).items():
            keep = sa.keep.expand_as(sa.weights[0])
            rows = keep[:, 0].any(-1)  # [B, T]
            layers = [(w * keep).mean(1) for w in sa.weights]  # [B, T, S]
            n = len(layers)
            acc = sums.setdefault(site, [torch.zeros(n, n, dtype=torch.float64), 0])
            for i in range(n):
                for j in range(n):
                    acc[0][i, j] += float(jsd(layers[i], layers[j])[rows].sum())
            acc[1] += int(rows.sum())
    return {site: (m / max(count, 1)).tolist() for site, (m, count) in sums.items()}


def plot_histograms(hists: dict, path, title: str = "") -> str:
    """One bar chart per (site, layer) of `weight_histograms`: x = attention weight, y = share of weights."""
    plt = pyplot()
    sites = list(hists)
    cols = max(len(v) for v in hists.values())
    fig, axes = plt.subplots(len(sites), cols, figsize=(2.6 * cols, 2.4 * len(sites)), squeeze=False, sharey=True)
    for r, site in enumerate(sites):
        for c, (layer, freq) in enumerate(sorted(hists[site].items())):
            edges = torch.linspace(0, 1, len(freq) + 1)
            axes[r][c].bar(edges[:-1].numpy(), freq, width=1 / len(freq), align="edge", edgecolor="white")
            axes[r][c].set_title(f"{site} layer {layer + 1}", fontsize=8)
            axes[r][c].set_xlabel("attention weight", fontsize=7)
        axes[r][0].set_ylabel("share of weights", fontsize=7)
    return save_figure(fig, path, title)


def plot_matrices(matrices: dict, path, title: str = "", label: str = "JSD") -> str:
    """One heatmap per site of an L x L layer-pair matrix (layers 1-based on both axes)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(matrices), figsize=(3.4 * len(matrices), 3.0), squeeze=False)
    for ax, (site, m) in zip(axes[0], matrices.items()):
        im = ax.imshow(m, cmap="viridis_r")
        n = len(m)
        ax.set_xticks(range(n), range(1, n + 1))
        ax.set_yticks(range(n), range(1, n + 1))
        ax.set_xlabel("layer")
        ax.set_ylabel("layer")
        ax.set_title(site, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, label=label)
    return save_figure(fig, path, title)
