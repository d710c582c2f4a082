"""`AnalyzeOptions`: what ``hf-attn analyze`` (and `report.analyze_dirs`) computes, one typed field per flag.

The command line (`hf_attn.cli.analyze`) takes every default and help line from these fields; the checks (one clear
error per option) are `report.check_options` and `figures.check_arguments`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields

NUMBER_LISTS = ("speed_batch_sizes", "speed_beams", "top_p_values", "long_lengths")  # comma lists on the command line


def _option(default, description: str):
    return field(default=default, metadata={"help": description})


@dataclass(frozen=True)
class AnalyzeOptions:
    """The options of ``hf-attn analyze``: ``analyze_dirs(AnalyzeOptions(("runs/rela-g",), figures="all"))``.

    Lists (``model_dirs``, ``figures`` given as names, the number lists) are kept as tuples; file and directory
    options are paths, or None for none. `report.check_options` validates a set of options.
    """

    model_dirs: Sequence[str] = field(metadata={"help": "directories written by `hf-attn train` (or save_pretrained "
                                                        "+ tokenizer)"})
    sentences: int = _option(200, "first N pairs of the split")
    split: str = _option("test", "the split of the run's data the pairs come from")
    test_file: str | None = _option(None, "pairs from this file instead of the run's data")
    top_p: float = _option(0.1, "fraction for the top-p% mass")
    tau: float = _option(1.0, "head-diversity temperature for ReLA's ReLU weights: softmax(w ** tau) (ReLA paper "
                              "Table 6: smaller tau, smoother distributions)")
    batch_size: int = _option(16, "pairs per forward pass")
    output: str | None = _option(None, "write the figures as JSON here")
    plot_dir: str | None = _option(None, "write <model>_attention.png here")
    figures: str | Sequence[str] | None = _option(None, "comma-separated figure names, or all")
    rank_null: str | None = _option(None, "rank the pairs of FILE (.jsonl/.tsv) by cross-attention null rate, most "
                                          "suspicious first (ReLA Section 5.4); implies the figure rela-rank-null")
    rank_output: str | None = _option(None, "TSV for the ranking (default FILE.<run>.null-ranked.tsv)")
    shuffle_fraction: float | None = _option(None, "shuffle the targets of this share of the pairs first and count "
                                                   "them in the top_share of the ranking")
    top_share: float = _option(0.1, "share of the ranking checked")
    gold_alignments: str | None = _option(None, "Pharaoh file (i-j sure, i?j possible; source-target words, "
                                                "0-based), one line per pair")
    alignment_layer: int | None = _option(None, "decoder layer for rela-alignment (unset: the penultimate)")
    num_beams: int = _option(4, "beam for BLEU and speed figures")
    speed_groups: int = _option(10, "source-length groups of equal size (ReLA Figure 2 uses 10)")
    speed_repeats: int = _option(1, "timed runs averaged (the papers use 3)")
    speed_batch_sizes: Sequence[int] = _option((1, 10, 50, 100), "batch sizes of RAN Figure 3")
    speed_beams: Sequence[int] = _option((1, 4, 8), "beam sizes of RAN Figure 3")
    top_p_values: Sequence[float] = _option((0.005, 0.01, 0.015, 0.05, 0.1), "top-p% shares for reluformer-*")
    long_lengths: Sequence[int] = _option((128, 256, 512), "input length limits L of reluformer-long")
    kendall_sentences: int = _option(50, "pairs for calibration-kendall")
    bins: int = _option(20, "histogram bins for ran-histograms")
    seed: int = _option(0, "seed of the shuffles")

    def __post_init__(self):
        for name in ("model_dirs", "figures", *NUMBER_LISTS):  # lists (from the command line or a caller) -> tuples
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))


def option_defaults() -> dict:
    """``{field: default}`` of every `AnalyzeOptions` field that has one (all but ``model_dirs``)."""
    return {f.name: f.default for f in fields(AnalyzeOptions) if f.default is not MISSING}
