"""``hf-attn``: train, evaluate, translate, push, analyze attention, list presets and Bible translations.

    hf-attn train [--preset rela-g] [--base marian|bart] [--source de --target en | --train_file F ... |
                  --dataset ID] [every Seq2SeqTrainingArguments / model config field] [--max_steps 300 | --minutes M] --output_dir DIR
    hf-attn evaluate DIR [--split test | --test_file F]
    hf-attn translate DIR [--input F] [--output F]        (stdin -> stdout by default)
    hf-attn push DIR REPO_ID [--private]
    hf-attn convert SOURCE OUTPUT_DIR [--preset rela-g] [--tokenizer DIR]   (a Marian/BART checkpoint -> hf-attn)
    hf-attn card DIR [--repo_id user/name]                (write the hf-attn model card, keeping a Trainer's summary)
    hf-attn metrics [DIR]                                 (sacrebleu/ and chrf/ for evaluate.load("sacrebleu") offline)
    hf-attn analyze DIR [DIR ...] [--sentences 200] [--output F.json] [--plot_dir D]   (attention statistics)
                    [--figures all|rela-aer,gmm-entropy,...] [--rank-null FILE] [--gold-alignments FILE]
                    (the five papers' tables and figures; `hf-attn analyze --help` lists them)
    hf-attn view DIR [DIR2 ...] [--sentences 20 | --text "..."] --output attention.html
                 (one self-contained HTML attention viewer; two directories: side by side)
    hf-attn reproduce [--presets P,...] [--pairs de-en,...] [--steps 600] [--seeds 42] [--output_dir results]
                      (a matrix of runs -> results/REPORT.md with significance tests, claims and plots)
    hf-attn presets [--verbose]                           (--verbose: settings, and every variant's hyperparameters)
    hf-attn corpora

Bad input gives one line ``hf-attn: error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from .errors import HfAttnPreempted

COMMANDS = ("train", "evaluate", "translate", "push", "convert", "card", "metrics", "analyze", "view", "reproduce",
            "presets", "corpora")


def _usage() -> str:
    return (__doc__ or "").strip()


def _errors():
    from .errors import HfAttnInputError

    classes = [HfAttnInputError]
    try:
        from .modeling import HfAttnConfigError

        classes.append(HfAttnConfigError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(classes)


def cmd_presets(argv) -> int:
    from . import PRESETS

    ap = argparse.ArgumentParser(prog="hf-attn presets", description="list the attention presets")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="also each preset's settings and paper, and every variant's hyperparameters (type, "
                         "default, valid values, help): the `hf-attn train` flags")
    a = ap.parse_args(argv)
    width = max(len(n) for n in PRESETS)
    for name, p in PRESETS.items():
        print(f"{name:<{width}}  {p.description}")
        if a.verbose:
            settings = ", ".join(f"{k}={v!r}" for k, v in p.overrides.items())
            print(f"{'':<{width}}    {settings}\n{'':<{width}}    {p.paper}")
    if a.verbose:
        print(describe_variants())
    return 0


def describe_variants() -> str:
    """Every attention variant: sites, description and its hyperparameters (the `hf-attn train` flags)."""
    from . import ATTENTION_VARIANTS

    lines = ["", "variants and their hyperparameters (flags of `hf-attn train`: --NAME VALUE):"]
    for name, cls in ATTENTION_VARIANTS.items():
        lines += ["", f"{name} (sites: {', '.join(cls.sites)}): {cls.description}"]
        for hp in cls.hyperparameters:
            lines.append(f"  --{hp.name} {hp.type_name()}: {hp.valid_values()}; default {hp.initial()!r}")
            lines.append(f"      {hp.help}")
        if not cls.hyperparameters:
            lines.append("  (no hyperparameters)")
    return "\n".join(lines)


def cmd_corpora(argv) -> int:
    from .data.bible import describe_translations

    argparse.ArgumentParser(prog="hf-attn corpora", description="list the Bible translations (--source/--target codes)").parse_args(argv)
    print(describe_translations())
    return 0


def cmd_train(argv) -> int:
    from .training.args import parse_train_args
    from .training.run import train

    hargs, targs, overrides, given = parse_train_args(argv)
    train(hargs, targs, overrides, given)
    return 0


def cmd_evaluate(argv) -> int:
    from .training.run import evaluate_dir
    from .io_utils import dumps_strict
    from .training.validate import DECODE_FLAGS, check_flags

    ap = argparse.ArgumentParser(prog="hf-attn evaluate", description="re-score a saved model (BLEU/chrF, sacrebleu)")
    ap.add_argument("model_dir")
    ap.add_argument("--split", default="test", choices=["test", "validation", "train"])
    ap.add_argument("--test_file", "--test-file", default=None, help="score on this file instead (.jsonl/.tsv)")
    ap.add_argument("--source", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None)
    ap.add_argument("--length_penalty", "--length-penalty", type=float, default=None)
    ap.add_argument("--batch_size", "--batch-size", type=int, default=32)
    ap.add_argument("--max_samples", "--max-samples", type=int, default=None)
    a = ap.parse_args(argv)
    check_flags(DECODE_FLAGS, a)
    out = evaluate_dir(a.model_dir, a.split, a.test_file, a.source, a.target, a.num_beams, a.length_penalty,
                       a.batch_size, a.max_samples)
    print(f"BLEU {out['bleu']:.2f} / chrF {out['chrf']:.2f} on {out['sentences']} sentences ({out['data']}), "
          f"beam {out['num_beams']} | {out['bleu_signature']}")
    print(dumps_strict(out))
    return 0


def cmd_translate(argv) -> int:
    from .errors import HfAttnInputError
    from .generation import decoding_settings, translate_texts
    from .io_utils import check_output_file, decode_utf8, read_text, text_lines
    from .rundir import check_model_files, load_model_dir, run_arg
    from .training.validate import DECODE_FLAGS, check_flags

    ap = argparse.ArgumentParser(prog="hf-attn translate", description="translate stdin or a file, one sentence per line")
    ap.add_argument("model_dir")
    ap.add_argument("--input", "-i", default=None, help="input file (default: stdin)")
    ap.add_argument("--output", "-o", default=None, help="output file (default: stdout)")
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None)
    ap.add_argument("--length_penalty", "--length-penalty", type=float, default=None)
    ap.add_argument("--batch_size", "--batch-size", type=int, default=32)
    a = ap.parse_args(argv)
    check_flags(DECODE_FLAGS, a)
    if a.input and not os.path.isfile(a.input):
        raise HfAttnInputError(f"--input {a.input!r}: no such file; give a text file with one sentence per line")
    if a.output:
        check_output_file(a.output, "--output")
    check_model_files(a.model_dir)  # before reading stdin
    if a.input:
        text = read_text(a.input, f"--input {a.input!r}")
    else:
        stdin = getattr(sys.stdin, "buffer", None)
        text = decode_utf8(stdin.read(), "stdin") if stdin is not None else sys.stdin.read()
    lines = text_lines(text)
    model, tokenizer = load_model_dir(a.model_dir)
    beams, lp = decoding_settings(model, a.num_beams, a.length_penalty)
    hyps = translate_texts(model, tokenizer, lines, num_beams=beams, length_penalty=lp, batch_size=a.batch_size,
                           progress=len(lines) > 64, max_source_length=run_arg(a.model_dir, "max_source_length", 256))
    text = "\n".join(hyps) + ("\n" if hyps else "")
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_push(argv) -> int:
    from .training.hub import push_model_dir

    ap = argparse.ArgumentParser(prog="hf-attn push", description="upload a trained model directory to the Hub")
    ap.add_argument("model_dir")
    ap.add_argument("repo_id")
    ap.add_argument("--private", action="store_true")
    ap.add_argument("--token", default=None)
    ap.add_argument("--revision", default=None)
    ap.add_argument("--commit_message", "--commit-message", default=None)
    a = ap.parse_args(argv)
    info = push_model_dir(a.model_dir, a.repo_id, private=a.private or None, token=a.token,
                          commit_message=a.commit_message, revision=a.revision)
    print(f"pushed {a.model_dir} to {getattr(info, 'commit_url', None) or a.repo_id}")
    return 0


def cmd_convert(argv) -> int:
    from .training.convert import convert_checkpoint

    ap = argparse.ArgumentParser(prog="hf-attn convert", description="swap a preset's attention into a Marian/BART "
                                 "checkpoint and save a complete model directory (model, code, tokenizer, card)")
    ap.add_argument("source", help="a Marian/BART (or hf-attn) model directory or Hub id")
    ap.add_argument("output_dir", help="a new or empty directory")
    ap.add_argument("--preset", default="rela-g", help="the attention preset (`hf-attn presets`; default rela-g)")
    ap.add_argument("--tokenizer", default=None, help="take the tokenizer from here (default: SOURCE)")
    a = ap.parse_args(argv)
    out = convert_checkpoint(a.source, a.output_dir, a.preset, tokenizer=a.tokenizer)
    print(f"converted {a.source} to {a.preset}: {out}")
    return 0


def cmd_card(argv) -> int:
    from .rundir import check_model_files
    from .training.cards import write_model_card

    ap = argparse.ArgumentParser(prog="hf-attn card", description="write the hf-attn model card (README.md) of a model "
                                 "directory; a card transformers' Trainer wrote there is kept as its training section")
    ap.add_argument("model_dir")
    ap.add_argument("--repo_id", "--repo-id", default=None, help="the Hub repo the card names (default: the directory)")
    a = ap.parse_args(argv)
    check_model_files(a.model_dir)
    check_hf_attn_model(a.model_dir)
    print(f"wrote {write_model_card(a.model_dir, a.repo_id)}")
    return 0


def check_hf_attn_model(model_dir: str) -> None:
    """One line when ``model_dir`` holds a model without hf-attn attention (a stock Marian/BART checkpoint)."""
    import json

    from .errors import HfAttnInputError
    from .modeling import HfAttnBartConfig, HfAttnMarianConfig

    config = os.path.join(model_dir, "config.json")
    try:
        model_type = json.loads(open(config, encoding="utf-8").read()).get("model_type")
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"{config!r} cannot be read as JSON ({e}); give a directory written by `hf-attn train`, "
                               "`hf-attn convert` or save_pretrained") from None
    if model_type not in (HfAttnMarianConfig.model_type, HfAttnBartConfig.model_type):
        raise HfAttnInputError(f"{model_dir!r} holds a {model_type or 'non-hf-attn'} model, without hf-attn attention: an "
                               "hf-attn card describes a variant; convert it first: `hf-attn convert "
                               f"{model_dir} OUTPUT_DIR --preset rela-g` (or the preset you want)")


def cmd_metrics(argv) -> int:
    from .metrics import install_metrics

    ap = argparse.ArgumentParser(prog="hf-attn metrics", description="write sacrebleu/sacrebleu.py and chrf/chrf.py "
                                 "into DIR: evaluate.load(\"sacrebleu\") run from DIR then loads them, offline")
    ap.add_argument("directory", nargs="?", default=".")
    a = ap.parse_args(argv)
    for path in install_metrics(a.directory):
        print(f"wrote {path}")
    return 0


def analyze_parser() -> argparse.ArgumentParser:
    from .analysis import figures, report

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
    figures.add_arguments(p)
    return p


def cmd_analyze(argv) -> int:
    from .analysis.report import analyze_dirs

    analyze_dirs(analyze_parser().parse_args(argv))
    return 0


def cmd_view(argv) -> int:
    from pathlib import Path

    from .analysis import viewer

    ap = argparse.ArgumentParser(prog="hf-attn view", description=viewer.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="+", help="model directories (`hf-attn train` or save_pretrained); two or more "
                    "are shown side by side and must share one tokenizer")
    ap.add_argument("--output", "-o", required=True, help="the HTML file to write, e.g. attention.html")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--sentences", type=int, default=None, help="the first N pairs of the first run's test split "
                      "(default 20)")
    what.add_argument("--text", default=None, help="one source sentence instead (attention over each model's own "
                      "translation)")
    ap.add_argument("--split", default="test", choices=("test", "validation", "train"))
    ap.add_argument("--test_file", "--test-file", default=None, help="pairs from this file instead of the run's data")
    ap.add_argument("--max_tokens", "--max-tokens", type=int, default=64, help="truncate sources and targets to this "
                    "many tokens (default 64)")
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None, help="beam for the translations "
                    "(default: the model's)")
    ap.add_argument("--preview", default=None, help="also write a PNG of the first sentence's cross-attention here")
    a = ap.parse_args(argv)
    out = viewer.write_viewer([Path(d) for d in a.model_dirs], Path(a.output), a.sentences, a.text, a.test_file,
                              a.split, a.max_tokens, a.num_beams, Path(a.preview) if a.preview else None)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def reproduce_parser() -> argparse.ArgumentParser:
    from .reproduce import runner

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
    return p


def cmd_reproduce(argv) -> int:
    from .reproduce.runner import reproduce

    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    a = reproduce_parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    return reproduce(a, train_args, " ".join(["hf-attn", "reproduce", *argv]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        print(f"hf-attn: error: unknown command {cmd!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
              f"valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    handler = {"train": cmd_train, "evaluate": cmd_evaluate, "translate": cmd_translate, "push": cmd_push,
               "convert": cmd_convert, "card": cmd_card, "metrics": cmd_metrics, "analyze": cmd_analyze,
               "view": cmd_view, "reproduce": cmd_reproduce, "presets": cmd_presets, "corpora": cmd_corpora}[cmd]
    try:
        return handler(rest)
    except _errors() as e:
        msg = " ".join(str(e).split())
        print(f"hf-attn: error: {msg}", file=sys.stderr)
        return 2
    except HfAttnPreempted as e:  # a signal stopped training after a checkpoint: one line, exit 75
        import signal

        from .training.trainer import PREEMPTION_SIGNALS

        for name in PREEMPTION_SIGNALS:  # a scheduler's repeated signal must not change the exit code
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        if os.environ.get("RANK", "0") == "0":
            print(f"hf-attn: {' '.join(str(e).split())}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("hf-attn: interrupted", file=sys.stderr)
        return 130
    except (OSError, RuntimeError) as e:
        if not _disk_full(e):
            raise
        where = getattr(e, "filename", None) or "the output directory"
        print(f"hf-attn: error: no space left on the device while writing {where}; free space or choose another "
              "--output_dir / --output and run again (with --resume for training: checkpoints are written whole or "
              "not at all, so the last complete one is intact)", file=sys.stderr)
        return 2


def _disk_full(e: BaseException) -> bool:
    """A full disk or quota: OSError ENOSPC / EDQUOT, or torch's checkpoint writer failing to write its file."""
    import errno

    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return "file write failed" in str(e) or "No space left on device" in str(e)


if __name__ == "__main__":
    sys.exit(main())
