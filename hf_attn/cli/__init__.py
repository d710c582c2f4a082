"""``hf-attn``: train, evaluate, translate, push, analyze attention, list presets and Bible translations.

    hf-attn train [--preset rela-g] [--base marian|bart] [--source de --target en | --train_file F ... |
                  --dataset ID] [every Seq2SeqTrainingArguments / model config field] [--max_steps 300 | --minutes M] --output_dir DIR
    hf-attn evaluate DIR [--split test | --test_file F]
    hf-attn translate DIR [--input F] [--output F]        (stdin -> stdout by default)
    hf-attn push DIR REPO_ID [--private]
    hf-attn convert SOURCE (OUTPUT_DIR | --output_dir DIR) [--preset rela-g] [--tokenizer DIR]   (Marian/BART -> hf-attn)
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

import difflib
import errno
import importlib
import os
import signal
import sys

from ..errors import PREEMPTION_SIGNALS, HfAttnInputError, HfAttnPreempted

COMMANDS = ("train", "evaluate", "translate", "push", "convert", "card", "metrics", "analyze", "view", "reproduce",
            "presets", "corpora")


def _usage() -> str:
    return (__doc__ or "").strip()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"hf-attn: error: unknown command {cmd!r}{hint}; "
              f"valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        # one module per command (hf_attn/cli/<command>.py), imported when it runs: torch and transformers load
        # only for the commands that use them (`hf-attn --help` and `hf-attn corpora` import neither)
        return importlib.import_module(f"{__name__}.{cmd}").run(rest)
    except (HfAttnInputError, ValueError) as e:
        if not isinstance(e, (HfAttnInputError, *_config_error())):
            raise
        msg = " ".join(str(e).split())
        print(f"hf-attn: error: {msg}", file=sys.stderr)
        return 2
    except HfAttnPreempted as e:  # a signal stopped training after a checkpoint: one line, exit 75
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


def _config_error() -> tuple[type, ...]:
    """`HfAttnConfigError` where the model code is imported (it can only have been raised then), else nothing."""
    declared = sys.modules.get("hf_attn.modeling.hyperparameters")
    return (declared.HfAttnConfigError,) if declared is not None else ()


def _disk_full(e: BaseException) -> bool:
    """A full disk or quota: OSError ENOSPC / EDQUOT, or torch's checkpoint writer failing to write its file."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return "file write failed" in str(e) or "No space left on device" in str(e)
