"""``hf-attn analyze DIR [DIR ...]``: attention statistics and the papers' figures."""

from __future__ import annotations

import argparse

from ..analysis import figures, report
from ..analysis.report import analyze_dirs
from ..errors import HfAttnInputError

def analyze_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hf-attn analyze", description=report.__doc__, epilog=figures.help_text(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dirs", nargs="+", help="directories written by `hf-attn train` (or save_pretrained + tokenizer)")
    p.add_argument("--sentences", type=int, default=200, help="first N pairs of the split (default 200)")
    p.add_argument("--split", default="test", choices=("test", "validation", "train"))
    p.add_argument("--test_file", "--test-file", default=None, help="pairs from this file instead of the run's data")
    p.add_argument("--top_p", "--top-p", type=float, default=0.1, help="fraction for the top-p%% mass (default 0.1)")
    p.add_argument("--tau", type=float, default=1.0, help="head-diversity temperature for ReLA's ReLU weights: "
                   "softmax(w ** tau) (ReLA paper Table 6: smaller tau, smoother distributions; default 1)")
    p.add_argument("--batch_size", "--batch-size", type=int, default=16)
    p.add_argument("--output", default=None, help="write the figures as JSON here")
    p.add_argument("--plot_dir", "--plot-dir", default=None, help="write <model>_attention.png here")
    add_figure_arguments(p)
    return p


def run(argv) -> int:
    analyze_dirs(analyze_parser().parse_args(argv))
    return 0


def _numbers(kind):
    def parse(text):
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise HfAttnInputError(f"{text!r}: need comma-separated {kind.__name__} values, e.g. 1,10,100") from None
        if not values or min(values) <= 0:
            raise HfAttnInputError(f"{text!r}: need values > 0, e.g. 1,10,100")
        return values
    return parse


def add_figure_arguments(p) -> None:
    """The figure options of `hf-attn analyze`."""
    g = p.add_argument_group("figures of the papers (see the list below)")
    g.add_argument("--figures", default=None, help="comma-separated figure names, or all")
    g.add_argument("--rank-null", "--rank_null", dest="rank_null", default=None, metavar="FILE",
                   help="rank the pairs of FILE (.jsonl/.tsv) by cross-attention null rate, most suspicious first "
                        "(ReLA Section 5.4); implies --figures rela-rank-null")
    g.add_argument("--rank_output", "--rank-output", default=None, help="TSV for the ranking (default FILE.<run>.null-ranked.tsv)")
    g.add_argument("--shuffle-fraction", "--shuffle_fraction", dest="shuffle_fraction", type=float, default=None,
                   help="shuffle the targets of this share of the pairs first and count them in the top --top_share")
    g.add_argument("--top_share", "--top-share", type=float, default=0.1, help="share of the ranking checked (0.1)")
    g.add_argument("--gold-alignments", "--gold_alignments", dest="gold_alignments", default=None, metavar="FILE",
                   help="Pharaoh file (i-j sure, i?j possible; source-target words, 0-based), one line per pair")
    g.add_argument("--alignment_layer", "--alignment-layer", type=int, default=None,
                   help="decoder layer for rela-alignment (default the penultimate)")
    g.add_argument("--num_beams", "--num-beams", type=int, default=4, help="beam for BLEU and speed figures (4)")
    g.add_argument("--speed_groups", type=int, default=10, help="source-length groups of equal size (ReLA Fig. 2: 10)")
    g.add_argument("--speed_repeats", type=int, default=1, help="timed runs averaged (the papers: 3)")
    g.add_argument("--speed_batch_sizes", type=_numbers(int), default=[1, 10, 50, 100], help="RAN Figure 3 (1,10,50,100)")
    g.add_argument("--speed_beams", type=_numbers(int), default=[1, 4, 8], help="RAN Figure 3 beam sizes (1,4,8)")
    g.add_argument("--top_p_values", type=_numbers(float), default=[0.005, 0.01, 0.015, 0.05, 0.1],
                   help="top-p%% shares for reluformer-* (0.005,...,0.1)")
    g.add_argument("--long_lengths", type=_numbers(int), default=[128, 256, 512], help="reluformer-long limits L")
    g.add_argument("--kendall_sentences", type=int, default=50, help="pairs for calibration-kendall (50)")
    g.add_argument("--bins", type=int, default=20, help="histogram bins for ran-histograms (20)")
    g.add_argument("--seed", type=int, default=0, help="seed of the shuffles (0)")
