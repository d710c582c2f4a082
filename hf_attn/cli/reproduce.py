"""``hf-attn reproduce``: train a matrix of runs and write the report (`reproduce.runner.reproduce`)."""

from __future__ import annotations

import argparse
import dataclasses

from ..reproduce import runner
from ..reproduce.runner import ReproduceOptions, reproduce
from .flags import OneLineParser

DEFAULTS = ReproduceOptions()  # every default lives in the dataclass


def reproduce_parser() -> argparse.ArgumentParser:
    d = DEFAULTS
    p = OneLineParser(
        prog="hf-attn reproduce", formatter_class=argparse.RawDescriptionHelpFormatter, description=runner.__doc__,
        epilog="Flags after `--` go to every `hf-attn train` run (e.g. -- --train_file F.jsonl --d_model 512).")
    p.add_argument("--presets", default=d.presets, help="comma-separated presets (softmax is the baseline)")
    p.add_argument("--pairs", default=d.pairs, help="comma-separated SOURCE-TARGET pairs: Bible codes "
                   "(`hf-attn corpora`), or the language keys of --train_file/--dataset given after --")
    p.add_argument("--steps", default=d.steps, help="comma-separated training budgets in optimizer steps")
    p.add_argument("--seeds", default=d.seeds, help="comma-separated seeds (42 = the main job's)")
    p.add_argument("--base", default=d.base, choices=("marian", "bart"))
    p.add_argument("--output_dir", "--output-dir", default=d.output_dir,
                   help=f"records and the report (default {d.output_dir})")
    p.add_argument("--runs_dir", "--runs-dir", default=d.runs_dir,
                   help=f"model directories and checkpoints (default {d.runs_dir})")
    p.add_argument("--jobs", type=int, default=d.jobs, help=f"runs at a time (default {d.jobs})")
    p.add_argument("--threads", type=int, default=d.threads,
                   help="torch threads per run (default: torch's; use 1 with --jobs 2 on 2 cores)")
    p.add_argument("--sentences", type=int, default=d.sentences,
                   help=f"pairs for the probe and attention statistics (default {d.sentences})")
    p.add_argument("--bootstrap", type=int, default=d.bootstrap,
                   help=f"paired bootstrap resamples (default {d.bootstrap}, sacrebleu's)")
    p.add_argument("--experiments", default=d.experiments, help="run the cells of an experiments file (e.g. "
                   "results/experiments.json: each cell is PRESET@ARM, an arm a list of train flags) instead of "
                   "--presets/--pairs/--steps/--seeds")
    p.add_argument("--only", default=d.only, help="with --experiments: comma-separated experiment ids to run")
    p.add_argument("--converged", default=d.converged, help="run a converged-matrix file (e.g. results/converged.json: "
                   "a pilot decides the budget by its pre-registered rule, then the matrix) instead of --presets/...")
    p.add_argument("--retrofit", default=d.retrofit, help="run a retrofit file (e.g. results/retrofit.json: softmax "
                   "parents, each swapped to the file's presets and fine-tuned, with a softmax control) instead of "
                   "--presets/...")
    p.add_argument("--deadline", type=float, default=d.deadline, metavar="SECONDS", help="start no run whose estimated "
                   "time would end more than SECONDS after the command started (one slot of machine time)")
    p.add_argument("--no_report", "--no-report", action="store_true", default=d.no_report,
                   help="train only; rebuild the report later with --report_only")
    p.add_argument("--report_only", "--report-only", action="store_true", default=d.report_only,
                   help="only rebuild the report from the records")
    p.add_argument("--readme", default=d.readme, help="also rewrite this README's block between <!-- "
                   "reproduce-headline:start --> and <!-- reproduce-headline:end --> with the report's headline table")
    p.add_argument("--docs", default=d.docs, metavar="DOCS_DIR", help="also rewrite the 'What we measured' block of "
                   "each paper's page, DOCS_DIR/papers/<paper>.md (e.g. --docs docs), from the report")
    return p


def parse_reproduce_args(argv: list[str]) -> tuple[ReproduceOptions, list[str]]:
    """(the options, the `hf-attn train` flags after ``--``) of an ``hf-attn reproduce`` command line."""
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ns = reproduce_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    return ReproduceOptions(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(ReproduceOptions)}), train_args


def run(argv) -> int:
    options, train_args = parse_reproduce_args(argv)
    return reproduce(options, train_args, " ".join(["hf-attn", "reproduce", *argv]))
