"""``hf-attn analyze DIR [DIR ...]``: attention statistics and the papers' figures."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..analysis import figures, report
from ..analysis.options import NUMBER_LISTS, AnalyzeOptions, option_defaults
from ..analysis.report import analyze_dirs
from ..rundir import SPLITS
from .flags import OneLineParser

_HELP = {f.name: f.metadata["help"] for f in fields(AnalyzeOptions)}
_DEFAULTS = option_defaults()


def _option(name: str) -> dict:
    """``default`` and ``help`` of the flag for the field ``name`` (both from `AnalyzeOptions`)."""
    default = _DEFAULTS[name]
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    text = _HELP[name].replace("%", "%%")  # argparse %-formats the help
    return {"default": default, "help": text if default is None else f"{text} (default {shown})"}


def analyze_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="hf-attn analyze", description=report.__doc__, epilog=figures.help_text(),
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dirs", nargs="+", help=_HELP["model_dirs"])
    p.add_argument("--sentences", type=int, **_option("sentences"))
    p.add_argument("--split", choices=SPLITS, **_option("split"))
    p.add_argument("--test_file", "--test-file", **_option("test_file"))
    p.add_argument("--top_p", "--top-p", type=float, **_option("top_p"))
    p.add_argument("--tau", type=float, **_option("tau"))
    p.add_argument("--batch_size", "--batch-size", type=int, **_option("batch_size"))
    p.add_argument("--output", **_option("output"))
    p.add_argument("--plot_dir", "--plot-dir", **_option("plot_dir"))
    add_figure_arguments(p)
    return p


def parse_options(argv) -> AnalyzeOptions:
    """The `AnalyzeOptions` of an `hf-attn analyze` command line."""
    return AnalyzeOptions(**vars(analyze_parser().parse_args(argv)))


def run(argv) -> int:
    analyze_dirs(parse_options(argv))
    return 0


def _numbers(kind):
    """The parser of a comma list of numbers > 0 (its errors are argparse's one line, naming the flag)."""
    def parse(text):
        try:
            values = tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: need comma-separated {kind.__name__} values, "
                                             "e.g. 1,10,100") from None
        if not values or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: need values > 0, e.g. 1,10,100")
        return values
    return parse


def add_figure_arguments(p) -> None:
    """The figure options of `hf-attn analyze`."""
    g = p.add_argument_group("figures of the papers (see the list below)")
    g.add_argument("--figures", **_option("figures"))
    g.add_argument("--rank-null", "--rank_null", dest="rank_null", metavar="FILE", **_option("rank_null"))
    g.add_argument("--rank_output", "--rank-output", **_option("rank_output"))
    g.add_argument("--shuffle-fraction", "--shuffle_fraction", dest="shuffle_fraction", type=float,
                   **_option("shuffle_fraction"))
    g.add_argument("--top_share", "--top-share", type=float, **_option("top_share"))
    g.add_argument("--gold-alignments", "--gold_alignments", dest="gold_alignments", metavar="FILE",
                   **_option("gold_alignments"))
    g.add_argument("--alignment_layer", "--alignment-layer", type=int, **_option("alignment_layer"))
    g.add_argument("--num_beams", "--num-beams", type=int, **_option("num_beams"))
    g.add_argument("--speed_groups", type=int, **_option("speed_groups"))
    g.add_argument("--speed_repeats", type=int, **_option("speed_repeats"))
    for name in NUMBER_LISTS:
        g.add_argument(f"--{name}", type=_numbers(float if name == "top_p_values" else int), **_option(name))
    g.add_argument("--kendall_sentences", type=int, **_option("kendall_sentences"))
    g.add_argument("--bins", type=int, **_option("bins"))
    g.add_argument("--seed", type=int, **_option("seed"))
