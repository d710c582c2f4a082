"""The flags of ``hf-attn train``, parsed by transformers' `HfArgumentParser` into the typed arguments of
`training.args`.

Three dataclasses: `HfAttnArguments` (data, preset, time budget, decoding), every `Seq2SeqTrainingArguments`
field, and every model config field (`model_config_arguments(base)`: built from the config dataclass, all
defaulting to None = "the preset's / hf-attn's default"). Each field is a flag under its own name, with
underscores or dashes: ``--max_steps 50 --d_model 256 --encoder-layers 3 --output_dir DIR``. Variant
hyperparameters take their declared type and valid values (`type_hyperparameter_flags`); bad input is one line.

A leaf of the CLI: it imports only `training.args`, `modeling`, `errors` and transformers, so that
`reproduce/` (whose matrix runs are `hf-attn train` command lines) can check and parse them too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from ..errors import HfAttnInputError
from ..modeling import PRESETS, HfAttnConfigError
from ..modeling.configuration_hf_attn import check_preset_hyperparameters
from ..training.args import (
    DEFAULT_MAX_STEPS,
    NULL,
    TRAINING_DEFAULTS,
    HfAttnArguments,
    hyperparameter_from_text,
    hyperparameters,
    model_config_arguments,
    model_overrides,
)
from .flags import pre_parse_base, unknown_flags_line


# ---- variant hyperparameter flags: types, valid values and help from each variant's `hyperparameters` -------------
def _hyperparameter_type(hp):
    def parse(text: str):
        value = hyperparameter_from_text(hp, text)
        try:
            if value is not NULL:
                hp.check(value)
        except HfAttnConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value

    parse.__name__ = hp.type_name()
    return parse


def _metavar(hp) -> str | None:
    if hp.choices is not None:
        return None  # argparse shows {a,b,c}
    if hp.type is bool:
        return "{true,false}"
    name = hp.element_type.__name__.upper()
    name = f"{name},{name},..." if hp.is_list else name
    return f"{name}|none" if hp.nullable else name


def type_hyperparameter_flags(parser) -> None:
    """Give each variant hyperparameter flag its declared type, valid values (checked while parsing, one error line)
    and metavar; choices are listed in ``--help``."""
    declared = hyperparameters()
    for action in parser._actions:
        hp = declared.get(action.dest)
        if hp is None or not action.option_strings:
            continue
        action.type, action.nargs, action.metavar = _hyperparameter_type(hp), None, _metavar(hp)
        action.choices = list(hp.choices) if hp.choices is not None else None


def join_negative_list_values(argv: list[str]) -> list[str]:
    """``--hard_gaussian_encoder_offsets -2,2`` -> ``--hard_gaussian_encoder_offsets=-2,2`` (argparse would read a
    value starting with '-' that is not a plain number as an unknown flag)."""
    names = {n for n, hp in hyperparameters().items() if hp.is_list}
    flags = {f"--{n}" for n in names} | {f"--{n.replace('_', '-')}" for n in names}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags and i + 1 < len(argv) and re.fullmatch(r"-[\d.][\d.,\s+-]*", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


# ---- the parser ---------------------------------------------------------------------------------------------------
def build_train_parser(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    base = pre_parse_base(argv)
    if base not in ("marian", "bart"):
        raise HfAttnInputError(f"--base {base!r} is not valid; valid: marian, bart")
    parser = HfArgumentParser((HfAttnArguments, Seq2SeqTrainingArguments, model_config_arguments(base)),
                              prog="hf-attn train",
                              description="Train an hf-attn model (default: rela-g, Bible German->English, 600 steps: about half an hour on 2 CPU cores), "
                              "score it on the test split with beam search and save a Hub-ready model directory.")
    parser.set_defaults(**TRAINING_DEFAULTS)
    type_hyperparameter_flags(parser)

    def one_line_error(message: str):
        raise HfAttnInputError(" ".join(message.split()))

    parser.error = one_line_error  # bad input gives one line (cli/__init__.py prints it), not usage + message
    return parser


def given_flags(argv: list[str]) -> set[str]:
    """Names of the flags present on the command line (``--foo-bar=1`` -> ``foo_bar``)."""
    out = set()
    for a in argv:
        if a.startswith("--"):
            out.add(a[2:].split("=", 1)[0].replace("-", "_"))
    return out


def broken_json_flag(parser, argv: list[str]) -> str | None:
    """The line for a dict-valued training flag (``--lr_scheduler_kwargs``, ``--fsdp_config``, ...) whose value opens
    a JSON object that does not parse (transformers' own error names neither the flag nor the value), or None."""
    ns, _ = parser.parse_known_args(argv)
    for name in getattr(Seq2SeqTrainingArguments, "_VALID_DICT_FIELDS", ()):
        value = getattr(ns, name, None)
        if isinstance(value, str) and value.startswith("{"):
            try:
                json.loads(value)
            except json.JSONDecodeError as e:
                return (f"--{name} {value} is not a JSON object ({e.msg} at character {e.pos}); give one in single "
                        f"quotes, e.g. --{name} '{{\"key\": 1}}'")
    return None


def parse_train_args(argv: list[str] | None = None):
    """(hf-attn args, Seq2SeqTrainingArguments, model overrides dict, the flags given)."""
    argv = join_negative_list_values(list(sys.argv[1:] if argv is None else argv))
    parser = build_train_parser(argv)
    given = given_flags(argv)
    # output_dir is needed before TrainingArguments' __post_init__ runs: give it a default from the run
    if "output_dir" not in given:
        ns, _ = parser.parse_known_args(argv)
        src, tgt = getattr(ns, "source", None) or "de", getattr(ns, "target", None) or "en"
        data = "bible" if not (getattr(ns, "train_file", None) or getattr(ns, "dataset", None)) else "data"
        argv += ["--output_dir", os.path.join("runs", f"{getattr(ns, 'preset', 'rela-g')}-{data}-{src}-{tgt}")]
    if torch.cuda.is_available() and not given & {"optim", "use_cpu"}:
        # CUDA: AdamW's fused kernel (a few launches per step, not a dozen per parameter tensor), which transformers
        # picks by default only from torch 2.8 on; the CPU keeps transformers' default
        argv += ["--optim", "adamw_torch_fused"]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "use_cpu" not in given:
        if not torch.cuda.is_available():
            # `accelerate launch --multi_gpu --num_processes N` / torchrun on a machine without GPUs: without
            # use_cpu, TrainingArguments sets up no process group and every process trains alone
            argv += ["--use_cpu", "true"]
    unknown = unknown_flags_line(argv, parser._option_string_actions)
    if unknown:  # the line `hf-attn train` gives before loading the parser (`snapshot.unknown_train_flags`)
        raise HfAttnInputError(unknown)
    try:
        hargs, targs, cargs = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except ValueError as e:
        raise HfAttnInputError(broken_json_flag(parser, argv) or str(e).strip().splitlines()[0]) from None
    if hargs.minutes is None and "max_steps" not in given and "num_train_epochs" not in given:
        targs.max_steps = DEFAULT_MAX_STEPS
    overrides = model_overrides(cargs)
    if hargs.preset in PRESETS:  # (an unknown preset is the flag checks' line)
        check_preset_hyperparameters(hargs.preset, overrides)  # a variant's flag the preset would ignore
    return hargs, targs, overrides, given
