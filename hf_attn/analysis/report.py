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
from ..rundir import SPLITS, check_model_files, load_model_dir, run_pairs
from . import figures
from .options import AnalyzeOptions
from .stats import attention_report, format_report, plot_layer_statistics


def check_options(options: AnalyzeOptions) -> list[str]:
    """Validate `hf-attn analyze`'s options (one clear error each); returns the figure names asked for."""
    o = options
    if isinstance(o.model_dirs, str) or not o.model_dirs:
        raise HfAttnInputError(f"model_dirs {o.model_dirs!r}: need a list of model directories, e.g. ['runs/rela-g']")
    names = figures.check_arguments(o)
    if o.sentences < 1:
        raise HfAttnInputError(f"--sentences {o.sentences}: need at least 1")
    if o.split not in SPLITS:
        raise HfAttnInputError(f"--split {o.split!r}: valid: {', '.join(SPLITS)}")
    if not 0 < o.top_p <= 1:
        raise HfAttnInputError(f"--top_p {o.top_p}: need a fraction in (0, 1], e.g. 0.1")
    if not (o.tau > 0 and o.tau < float("inf")):
        raise HfAttnInputError(f"--tau {o.tau}: need a temperature > 0, e.g. 0.5")
    if o.batch_size < 1:
        raise HfAttnInputError(f"--batch_size {o.batch_size}: need at least 1")
    if o.output:  # checked before the analysis, not after it
        check_output_file(o.output, "--output")
    if o.plot_dir:
        ensure_writable_dir(o.plot_dir, "--plot_dir")
    for d in o.model_dirs:  # every directory before the first is analyzed, not when its turn comes
        check_model_files(d)
    return names


def analyze_dirs(options: AnalyzeOptions) -> dict:
    """`hf-attn analyze`: ``{model_dir: statistics}`` (with the asked-for figures under ``"figures"``) for each
    directory in ``options.model_dirs``; prints a table, writes ``options.output`` and the plots."""
    o = options
    names = check_options(o)
    results = {}
    print(f"{'model':<28} {'site':<8} {'sparsity':>8} {'null rate':>9} {'entropy':>8} {'head div.':>9} "
          f"{'top-' + format(o.top_p, '.0%') + ' mass':>9}")
    for d in o.model_dirs:
        src, ref, what, _ = run_pairs(d, o.split, o.test_file, max_samples=o.sentences)  # a bad file: before loading
        rank_pairs = run_pairs(d, o.split, o.rank_null, flag="--rank-null")[:2] if o.rank_null else None
        model, tokenizer = load_model_dir(d)
        src, ref = src[: o.sentences], ref[: o.sentences]
        if not src:
            raise HfAttnInputError(f"{d!r}: the {what} has no sentence pairs")
        rep = attention_report(model.eval(), tokenizer, src, ref, batch_size=o.batch_size, top_p=o.top_p,
                               progress=len(src) > 4 * o.batch_size, tau=o.tau)
        rep["data"] = what
        rep["preset"] = getattr(model.config, "preset", None)
        if names:
            ctx = figures.Context(model, tokenizer, Path(d).name, src, ref, o)
            if rank_pairs is not None:
                ctx.cache["rank_pairs"] = rank_pairs
            rep["figures"] = figures.run_figures(ctx, names)
        results[d] = rep
        print(format_report(Path(d).name, rep), flush=True)
        if o.plot_dir:
            Path(o.plot_dir).mkdir(parents=True, exist_ok=True)
            path = Path(o.plot_dir) / f"{Path(d).name}_attention.png"
            plot_layer_statistics(rep["layers"], path, title=f"{Path(d).name} ({rep['preset']}): {len(src)} sentences")
            print(f"wrote {path}")
    if o.output:
        write_json(o.output, results)
        print(f"wrote {o.output}")
    return results

