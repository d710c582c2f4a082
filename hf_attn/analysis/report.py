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

from ..errors import HfAttnInputError
from ..io_utils import check_output_file, ensure_writable_dir, write_json
from ..rundir import load_model_dir, run_pairs
from . import figures
from .stats import attention_report, format_report, plot_layer_statistics

def check_options(a) -> list[str]:
    """Validate `hf-attn analyze`'s options (one clear error each); returns the figure names asked for."""
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

        check_output_file(a.output, "--output")
    if a.plot_dir:
        ensure_writable_dir(a.plot_dir, "--plot_dir")
    return names


def analyze_dirs(a) -> dict:
    """`hf-attn analyze`: the statistics (and the asked-for figures) of each model directory in ``a.model_dirs``."""
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
        write_json(a.output, results)
        print(f"wrote {a.output}")
    return results
