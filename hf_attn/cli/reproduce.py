"""``hf-attn reproduce``: train a matrix of runs and write the report."""

from __future__ import annotations

import argparse
import os

from ..reproduce import runner
from ..reproduce.runner import reproduce

def reproduce_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-attn reproduce", formatter_class=argparse.RawDescriptionHelpFormatter, description=runner.__doc__,
        epilog="Flags after `--` go to every `hf-attn train` run (e.g. -- --train_file F.jsonl --d_model 512).")
    p.add_argument("--presets", default="softmax,rela-g", help="comma-separated presets (softmax is the baseline)")
    p.add_argument("--pairs", default="de-en", help="comma-separated SOURCE-TARGET pairs: Bible codes "
                   "(`hf-attn corpora`), or the language keys of --train_file/--dataset given after --")
    p.add_argument("--steps", default="600", help="comma-separated training budgets in optimizer steps")
    p.add_argument("--seeds", default="42", help="comma-separated seeds (42 = the main job's)")
    p.add_argument("--base", default="marian", choices=("marian", "bart"))
    p.add_argument("--output_dir", "--output-dir", default="results", help="records and the report (default results)")
    p.add_argument("--runs_dir", "--runs-dir", default=os.path.join("runs", "reproduce"),
                   help="model directories and checkpoints (default runs/reproduce)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: torch's; use 1 with --jobs 2 on 2 cores)")
    p.add_argument("--sentences", type=int, default=200, help="pairs for the probe and attention statistics (default 200)")
    p.add_argument("--bootstrap", type=int, default=1000, help="paired bootstrap resamples (default 1000, sacrebleu's)")
    p.add_argument("--experiments", default=None, help="run the cells of an experiments file (e.g. "
                   "results/experiments.json: each cell is PRESET@ARM, an arm a list of train flags) instead of "
                   "--presets/--pairs/--steps/--seeds")
    p.add_argument("--only", default=None, help="with --experiments: comma-separated experiment ids to run")
    p.add_argument("--report_only", "--report-only", action="store_true", help="only rebuild the report from the records")
    p.add_argument("--readme", default=None, help="also rewrite this README's block between <!-- reproduce-headline:start "
                   "--> and <!-- reproduce-headline:end --> with the report's headline table")
    p.add_argument("--docs", default=None, metavar="DOCS_DIR", help="also rewrite the 'What we measured' block of each "
                   "paper's page, DOCS_DIR/papers/<paper>.md (e.g. --docs docs), from the report")
    return p


def run(argv) -> int:
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = reproduce_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    return reproduce(a, train_args, " ".join(["hf-attn", "reproduce", *argv]))
