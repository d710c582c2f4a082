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

from .common import pyplot, save_figure

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
