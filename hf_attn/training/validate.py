"""Every flag checked before any work starts: one table of (flag, check, valid range) per command.

`hf-attn train` runs `check_train_flags` first (before the output directory, the data or the tokenizer), then
`check_model_flags` (builds the model config, which is cheap) and `check_cache_dir`; `translate`/`evaluate` run
`check_flags` on `DECODE_FLAGS`. A failed check is one line naming the flag, the value and the valid range."""

from __future__ import annotations

import math
import os
from typing import Any, Callable

import accelerate

from ..data.tokenizer import cache_root
from ..errors import HfAttnInputError
from ..io_utils import ensure_writable_dir
from ..modeling import presets
from ..modeling.bases import get_base
from .args import MODEL_DEFAULTS

Check = tuple[str, Callable[[Any], bool], str]  # (flag name, check, valid range in words)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def int_ge(lo: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo), f"an integer >= {lo}"


def num_gt(lo: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _num(v) and v > lo), f"a number > {lo:g}"


def num_ge(lo: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _num(v) and v >= lo), f"a number >= {lo:g}"


def unit() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: _num(v) and 0 <= v < 1), "a number in [0, 1)"


PROBABILITY = ((lambda v: _num(v) and 0 <= v < 1), "a probability in [0, 1)")
FINITE = (_num, "a finite number")


def _row(flag: str, rule: tuple) -> Check:
    return (flag, *rule)


# `hf-attn train`: hf-attn's flags and the Seq2SeqTrainingArguments that a run uses (None = not given / default)
TRAIN_FLAGS: list[Check] = [
    _row("learning_rate", num_gt(0)),
    _row("per_device_train_batch_size", int_ge(1)),
    _row("per_device_eval_batch_size", int_ge(1)),
    _row("gradient_accumulation_steps", int_ge(1)),
    ("max_steps", lambda v: v == -1 or (isinstance(v, int) and v >= 1),
     "an integer >= 1 (or -1 with --num_train_epochs or --minutes)"),
    _row("num_train_epochs", num_gt(0)),
    _row("warmup_steps", num_ge(0)),
    _row("warmup_ratio", unit()),
    _row("weight_decay", num_ge(0)),
    _row("max_grad_norm", num_ge(0)),
    _row("adam_beta1", unit()),
    _row("adam_beta2", unit()),
    _row("adam_epsilon", num_gt(0)),
    _row("label_smoothing_factor", unit()),
    _row("logging_steps", num_gt(0)),
    _row("save_steps", num_gt(0)),
    _row("eval_steps", num_gt(0)),
    ("seed", lambda v: isinstance(v, int) and 0 <= v < 2 ** 32, "an integer in [0, 4294967295]"),
    _row("num_beams", int_ge(1)),
    _row("generation_num_beams", int_ge(1)),
    _row("generation_max_length", int_ge(1)),
    _row("length_penalty", FINITE),
    _row("generation_max_new_tokens", int_ge(1)),
    _row("vocab_size", int_ge(16)),
    _row("max_source_length", int_ge(2)),
    _row("max_target_length", int_ge(2)),
    ("max_length_ratio", lambda v: _num(v) and (v == 0 or v >= 1), "0 (keep all) or a ratio >= 1"),
    _row("max_train_samples", int_ge(0)),
    _row("max_eval_samples", int_ge(0)),
    _row("max_predict_samples", int_ge(0)),
    _row("minutes", num_ge(0)),
    _row("noam_factor", num_gt(0)),
    _row("average_checkpoints", int_ge(0)),
    ("embedding_init_std", lambda v: _num(v) and v >= 0,
     "a std >= 0 (0 keeps the model's init_std; default d_model**-0.5)"),
]

# `hf-attn translate` / `evaluate`
DECODE_FLAGS: list[Check] = [
    _row("batch_size", int_ge(1)),
    _row("num_beams", int_ge(1)),
    _row("length_penalty", FINITE),
    _row("max_samples", int_ge(1)),
]


def check_flags(table: list[Check], *sources) -> None:
    """Check each flag of ``table`` found (not None) on the first of ``sources`` that has it."""
    for flag, ok, valid in table:
        src = next((s for s in sources if hasattr(s, flag)), None)
        value = getattr(src, flag, None)
        if value is not None and not ok(value):
            raise HfAttnInputError(f"--{flag} {value}: need {valid}")


def check_preset(name: str) -> None:
    """One error line for a `--preset` that is not a preset."""
    presets.check_preset(name, "--preset", f"; valid: {', '.join(presets.PRESETS)} (`hf-attn presets` describes them)")


def check_train_flags(hargs, targs) -> None:
    check_preset(hargs.preset)
    check_flags(TRAIN_FLAGS, hargs, targs)
    if targs.max_steps == -1 and not hargs.minutes and not targs.num_train_epochs:
        raise HfAttnInputError("--num_train_epochs 0: need a number > 0, or give --max_steps N")
    if targs.push_to_hub and not (hargs.hub_repo_id or targs.hub_model_id):
        raise HfAttnInputError("--push_to_hub needs --hub_model_id user/name (the repo to create or update)")
    check_fsdp_device(targs)


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
        if k.endswith("dropout") and v is not None and not PROBABILITY[0](v):
            raise HfAttnInputError(f"--{k} {v}: need {PROBABILITY[1]}")
    if resume or hargs.init_from:
        return
    cfg = get_base(hargs.base).config_class.from_preset(hargs.preset, **{**MODEL_DEFAULTS, **overrides})
    for side in ("encoder", "decoder"):
        heads = getattr(cfg, f"{side}_attention_heads")
        if not isinstance(heads, int) or heads < 1 or cfg.d_model % heads:
            raise HfAttnInputError(f"--{side}_attention_heads {heads} does not divide --d_model {cfg.d_model}; give a "
                                   f"head count that divides it (e.g. {_divisors(cfg.d_model)})")
        for k in (f"{side}_layers", f"{side}_ffn_dim"):
            if getattr(cfg, k) < 1:
                raise HfAttnInputError(f"--{k} {getattr(cfg, k)}: need an integer >= 1")
    if cfg.d_model < 2:
        raise HfAttnInputError(f"--d_model {cfg.d_model}: need an integer >= 2")


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
