"""``hf-attn analyze``: what the attention of trained models learned, side by side.

For each model directory, on the first ``--sentences`` pairs of its run's test split (teacher forcing with the
references), per site (encoder self-, decoder self-, cross-attention) and layer:

* sparsity and null rate: share of exact zeros / of all-zero rows among visible entries (ReLA paper, Section 5);
* entropy of each row renormalised to sum 1 (null rows excluded), in nats;
* head diversity: Jensen-Shannon divergence between the heads (ReLA paper, Section 5.2);
* top-p% mass: the share of a row's weight held by its largest p% of entries (ReLUFormer paper, Section 3.4).

Writes the figures as JSON (``--output``) and one plot per model (``--plot_dir``): the statistics per layer, one
line per site. ``--figures NAME,...`` (or ``all``) adds the papers' tables and figures listed below, each under
``"figures"`` in the JSON and as ``<run>_<figure>.png`` in ``--plot_dir``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .common import tokenized_batches
from .stats import collect_attentions, layer_statistics, plot_layer_statistics, top_p_mass

SITES = ("encoder", "decoder", "cross")
LAYER_KEYS = ("sparsity", "null_rate", "entropy", "head_diversity")


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


def check_options(a) -> list[str]:
    """Validate `hf-attn analyze`'s options (one clear error each); returns the figure names asked for."""
    from ..errors import HfAttnInputError
    from . import figures

    names = figures.check_arguments(a)
    if a.sentences < 1:
        raise HfAttnInputError(f"--sentences {a.sentences}: need at least 1")
    if not 0 < a.top_p <= 1:
        raise HfAttnInputError(f"--top_p {a.top_p}: need a fraction in (0, 1], e.g. 0.1")
    if not (a.tau > 0 and a.tau < float("inf")):
        raise HfAttnInputError(f"--tau {a.tau}: need a temperature > 0, e.g. 0.5")
    if a.batch_size < 1:
        raise HfAttnInputError(f"--batch_size {a.batch_size}: need at least 1")
    if a.output:  # checked before the analysis, not after it
        from ..io_utils import check_output_file

        check_output_file(a.output, "--output")
    if a.plot_dir:
        from ..io_utils import ensure_writable_dir

        ensure_writable_dir(a.plot_dir, "--plot_dir")
    return names


def analyze_dirs(a) -> dict:
    """`hf-attn analyze`: the statistics (and the asked-for figures) of each model directory in ``a.model_dirs``."""
    from ..errors import HfAttnInputError
    from ..rundir import load_model_dir, run_pairs
    from . import figures

    names = check_options(a)
    results = {}
    print(f"{'model':<28} {'site':<8} {'sparsity':>8} {'null rate':>9} {'entropy':>8} {'head div.':>9} "
          f"{'top-' + format(a.top_p, '.0%') + ' mass':>9}")
    for d in a.model_dirs:
        model, tokenizer = load_model_dir(d)
        src, ref, what, _ = run_pairs(d, a.split, a.test_file, max_samples=a.sentences)
        src, ref = src[: a.sentences], ref[: a.sentences]
        if not src:
            raise HfAttnInputError(f"{d!r}: the {what} has no sentence pairs")
        rep = attention_report(model.eval(), tokenizer, src, ref, batch_size=a.batch_size, top_p=a.top_p,
                               progress=len(src) > 4 * a.batch_size, tau=a.tau)
        rep["data"] = what
        rep["preset"] = getattr(model.config, "preset", None)
        if names:
            ctx = figures.Context(model, tokenizer, Path(d).name, src, ref, a)
            if a.rank_null:
                ctx.cache["rank_pairs"] = run_pairs(d, a.split, a.rank_null)[:2]
            rep["figures"] = figures.run_figures(ctx, names)
        results[d] = rep
        print(format_report(Path(d).name, rep), flush=True)
        if a.plot_dir:
            Path(a.plot_dir).mkdir(parents=True, exist_ok=True)
            path = Path(a.plot_dir) / f"{Path(d).name}_attention.png"
            plot_layer_statistics(rep["layers"], path, title=f"{Path(d).name} ({rep['preset']}): {len(src)} sentences")
            print(f"wrote {path}")
    if a.output:
        from ..io_utils import write_json

        write_json(a.output, results)
        print(f"wrote {a.output}")
    return results
