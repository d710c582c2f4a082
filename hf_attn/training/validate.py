"""Every flag checked before any work starts: one table of flag declarations per command.

A `Flag` declares a flag's valid values in the words of the variants' hyperparameters (`ValidValues`: type,
``low``/``high``, ``*_open``, ``choices``, ``also``), so a flag and a hyperparameter are checked, and their valid values
worded, by one implementation. `hf-attn train` runs `check_train_flags` first (before the output directory, the data
or the tokenizer), then `check_model_flags` (builds the model config, which is cheap) and `check_cache_dir`;
`translate`/`evaluate` run `check_flags` on `DECODE_FLAGS`. A failed check is one line naming the flag, the value
and the valid values, e.g. ``--num_beams 0 must be an integer >= 1``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace

import accelerate

from ..data.tokenizer import cache_root
from ..errors import HfAttnInputError
from ..io_utils import ensure_writable_dir
from ..modeling import presets
from ..modeling.bases import get_base
from ..modeling.hyperparameters import ValidValues
from .args import MODEL_DEFAULTS


@dataclass(frozen=True)
class Flag(ValidValues):
    """One command-line flag's valid values (see `ValidValues`); None (not given, or the default) is not checked."""

    name: str
    type: object

    def check(self, value) -> None:
        """Raise `HfAttnInputError` (one line: the flag, the value, what is valid) unless ``value`` is None or valid."""
        if value is not None and not self.accepts(value):
            raise HfAttnInputError(f"--{self.name} {value} {self.requirement()}")


def probability(name: str) -> Flag:
    """A dropout rate: in [0, 1)."""
    return Flag(name, float, low=0.0, high=1.0, high_open=True)


# `hf-attn train`: hf-attn's flags and the Seq2SeqTrainingArguments that a run uses (None = not given / default)
TRAIN_FLAGS: list[Flag] = [
    Flag("learning_rate", float, low=0.0, low_open=True),
    Flag("per_device_train_batch_size", int, low=1),
    Flag("per_device_eval_batch_size", int, low=1),
    Flag("gradient_accumulation_steps", int, low=1),
    Flag("max_steps", int, low=1, also=((-1, "with --num_train_epochs or --minutes"),)),
    Flag("num_train_epochs", float, low=0.0, low_open=True),
    Flag("warmup_steps", float, low=0.0),
    probability("warmup_ratio"),
    Flag("weight_decay", float, low=0.0),
    Flag("max_grad_norm", float, low=0.0),
    probability("adam_beta1"),
    probability("adam_beta2"),
    Flag("adam_epsilon", float, low=0.0, low_open=True),
    probability("label_smoothing_factor"),
    Flag("logging_steps", float, low=0.0, low_open=True),
    Flag("save_steps", float, low=0.0, low_open=True),
    Flag("eval_steps", float, low=0.0, low_open=True),
    Flag("seed", int, low=0, high=2 ** 32 - 1),
    Flag("num_beams", int, low=1),
    Flag("generation_num_beams", int, low=1),
    Flag("generation_max_length", int, low=1),
    Flag("length_penalty", float),
    Flag("generation_max_new_tokens", int, low=1),
    Flag("vocab_size", int, low=16),
    Flag("max_source_length", int, low=2),
    Flag("max_target_length", int, low=2),
    Flag("max_length_ratio", float, low=1.0, also=((0, "keep all"),)),
    Flag("max_train_samples", int, low=0),
    Flag("max_eval_samples", int, low=0),
    Flag("max_predict_samples", int, low=0),
    Flag("minutes", float, low=0.0),
    Flag("noam_factor", float, low=0.0, low_open=True),
    Flag("average_checkpoints", int, low=0),
    Flag("eval_bleu_every", int, low=0),
    Flag("eval_bleu_sentences", int, low=1),
    Flag("eval_bleu_beams", int, low=1),
    Flag("embedding_init_std", float, low=0.0),  # 0 keeps the model's init_std (the flag's help)
]

# the model config, as built from the train flags (`check_model_flags`)
MODEL_FLAGS: list[Flag] = [
    *(Flag(f"{side}_{k}", int, low=1) for side in ("encoder", "decoder") for k in ("layers", "ffn_dim")),
    Flag("d_model", int, low=2),
]

# the training flags whose value is a dict of keyword arguments, given as a JSON object (transformers parses it), with
# an example each (the scheduler's: the default inverse_sqrt schedule's timescale)
KWARGS_FLAGS = {"lr_scheduler_kwargs": '{"timescale": 4000}',
                "activation_checkpointing_kwargs": '{"use_reentrant": false}',
                "gradient_checkpointing_kwargs": '{"use_reentrant": false}'}

# `hf-attn translate` / `evaluate`
DECODE_FLAGS: list[Flag] = [
    Flag("batch_size", int, low=1),
    Flag("num_beams", int, low=1),
    Flag("length_penalty", float),
    Flag("max_samples", int, low=1),
]


def check_flags(table: list[Flag], *sources) -> None:
    """Check each flag of ``table`` found (not None) on the first of ``sources`` that has it."""
    for flag in table:
        src = next((s for s in sources if hasattr(s, flag.name)), None)
        flag.check(getattr(src, flag.name, None))


def check_preset(name: str) -> None:
    """One error line for a `--preset` that is not a preset."""
    presets.check_preset(name, "--preset", f"; valid: {', '.join(presets.PRESETS)} (`hf-attn presets` describes them)")


def check_train_flags(hargs, targs) -> None:
    check_preset(hargs.preset)
    check_flags(TRAIN_FLAGS, hargs, targs)
    if targs.max_steps == -1 and not hargs.minutes and not targs.num_train_epochs:
        epochs = next(f for f in TRAIN_FLAGS if f.name == "num_train_epochs")
        raise HfAttnInputError(f"--num_train_epochs {targs.num_train_epochs} {epochs.requirement()}, or give "
                               "--max_steps N")
    if targs.push_to_hub and not (hargs.hub_repo_id or targs.hub_model_id):
        raise HfAttnInputError("--push_to_hub needs --hub_model_id user/name (the repo to create or update)")
    check_fsdp_device(targs)
    check_dispatch_batches(targs)
    check_kwargs_flags(targs)


def check_kwargs_flags(targs) -> None:
    """A keyword-arguments flag given something that is not a JSON object (transformers keeps any other text as a
    string, and the run failed at its first use, e.g. the scheduler's ``**kwargs``): one line."""
    for name, example in KWARGS_FLAGS.items():
        value = getattr(targs, name, None)
        if value is not None and not isinstance(value, dict):
            raise HfAttnInputError(f"--{name} {value} is not a JSON object: give the keyword arguments as one, in "
                                   f"single quotes, e.g. --{name} '{example}'")


def check_dispatch_batches(targs) -> None:
    """accelerate's ``dispatch_batches``: process 0 loads every batch and concatenates the processes' shares, which
    needs batches of one shape; hf-attn pads each batch to its own longest sentence, so the run stopped at its first
    step with a tensor-size traceback. One line instead."""
    config = getattr(targs, "accelerator_config", None)
    if targs.world_size > 1 and getattr(config, "dispatch_batches", None):
        raise HfAttnInputError(
            "--accelerator_config dispatch_batches true: process 0 would load every batch and concatenate the "
            "processes' shares, which must have one shape, and hf-attn pads each batch to its own longest sentence; "
            "drop dispatch_batches (every process then loads its own batches)"
        )


def check_fsdp_device(targs) -> None:
    """FSDP asked for on CPU processes: accelerate builds its FSDP plugin only for GPU-type process groups (its
    state keeps a CPU group as MULTI_CPU), so `--fsdp` / `accelerate launch --use_fsdp` would train with plain DDP,
    every process holding the whole model, without a word. One line instead."""
    wants_fsdp = bool(targs.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if wants_fsdp and targs.device.type == "cpu":
        raise HfAttnInputError(
            f"--fsdp: FSDP needs GPU processes; on CPU processes accelerate {accelerate.__version__} leaves FSDP off "
            "and trains with DDP (every process holds the whole model); drop --fsdp (and accelerate's --use_fsdp) to "
            "train with DDP on CPU, or launch on GPUs"
        )


def check_model_flags(hargs, overrides: dict, resume: bool) -> None:
    """Model config values: dropout probabilities, heads that divide d_model; the config is built (cheap) so that
    what it rejects is rejected now, not after data loading and tokenizer training."""
    for k, v in overrides.items():
        if k.endswith("dropout"):
            probability(k).check(v)
    if resume or hargs.init_from:
        return
    fields = {**MODEL_DEFAULTS, **overrides}  # the sizes in the flags' words first, then the config's own rules
    check_flags(MODEL_FLAGS, SimpleNamespace(**{f.name: fields.get(f.name) for f in MODEL_FLAGS}))
    for side in ("encoder", "decoder"):
        heads, d_model = fields[f"{side}_attention_heads"], fields["d_model"]
        if not isinstance(heads, int) or heads < 1 or d_model % heads:
            raise HfAttnInputError(f"--{side}_attention_heads {heads} does not divide --d_model {d_model}; give a "
                                   f"head count that divides it (e.g. {_divisors(d_model)})")
    get_base(hargs.base).config_class.from_preset(hargs.preset, **fields)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 16) + 1) if n % d == 0)


def check_cache_dir(hargs, trains_tokenizer: bool) -> None:
    """The tokenizer cache must be writable when a tokenizer will be trained: checked before the data is loaded."""
    if not trains_tokenizer:
        return

    if hargs.cache_dir:
        ensure_writable_dir(hargs.cache_dir, "--cache_dir")
    elif os.environ.get("HF_ATTN_CACHE"):
        ensure_writable_dir(cache_root() / "tokenizers", "$HF_ATTN_CACHE")
    else:
        ensure_writable_dir(cache_root() / "tokenizers", "the tokenizer cache (~/.cache/hf_attn; set $HF_ATTN_CACHE)")
