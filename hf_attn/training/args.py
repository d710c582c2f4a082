"""The typed arguments of ``hf-attn train``: hf-attn's defaults and the dataclasses its flags fill.

`HfAttnArguments` (data, preset, time budget, decoding), hf-attn's defaults for `Seq2SeqTrainingArguments`
(`TRAINING_DEFAULTS`) and for the model (`MODEL_DEFAULTS`, with the papers' `PAPER_RECIPE`), and
`model_config_arguments(base)`: one field per model config field and variant hyperparameter, all defaulting to None
= "the preset's / hf-attn's default". `model_overrides` turns the given ones into config overrides,
`hyperparameter_from_text` reads a hyperparameter's value from text (``none`` -> `NULL` where None is valid).

No parsing here: `cli/train_args.py` builds the flags from these dataclasses (`parse_train_args`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from transformers import Seq2SeqTrainingArguments

from ..errors import HfAttnInputError
from ..modeling.bases import BASES
from ..modeling.configuration_hf_attn import hyperparameters as declared

# hf-attn's defaults for the main job (a small Marian that trains on 2 CPU cores: d_model 256, 3+3 layers,
# 4 heads, FFN 1024, lr 1e-3 inverse-sqrt, 300 warm-up steps, label smoothing 0.1, batch 64 verses).
# scale_embedding=True (token embeddings x sqrt(d_model), as in Vaswani et al. 2017, fairseq and the opus-mt
# configs): MarianConfig's default False leaves the 0.02-std token embeddings ~35x smaller than the sinusoidal
# positions, and the model sits on a unigram plateau (loss ~6.3) for 300 steps (BLEU 0.0). The token embeddings
# themselves are drawn from N(0, d_model**-0.5) (`--embedding_init_std`, `build.init_embeddings`), as in fairseq and the
# ReLA authors' code, so that they enter at unit scale like the positions.
# Validation: the loss every 100 steps (results.json "curves"), no generation (`--prediction_loss_only false` with
# `--predict_with_generate` adds validation BLEU); the test split is translated once, after training.
TRAINING_DEFAULTS = dict(
    learning_rate=1e-3, lr_scheduler_type="inverse_sqrt", warmup_steps=300, label_smoothing_factor=0.1,
    per_device_train_batch_size=64, per_device_eval_batch_size=32, adam_beta2=0.98, weight_decay=0.0,
    max_grad_norm=1.0, logging_steps=25, logging_first_step=True, save_strategy="steps", save_steps=100,
    save_total_limit=2, eval_strategy="steps", eval_steps=100, prediction_loss_only=True, report_to="none", seed=42,
    predict_with_generate=True,
    train_sampling_strategy="group_by_length", dataloader_num_workers=0, dataloader_pin_memory=False,
)
# The rest of the architecture follows the papers' Transformer (Vaswani et al. 2017), which all five train: a ReLU
# feed-forward layer, and dropout 0.1 on the residual connections and on the attention weights ("We apply dropout
# to the residual connections and attention weights, with a rate of 0.1": ReLA, Zhang et al. 2021, Sec. 4;
# ReLUFormer, Shen et al. 2023, App. A, IWSLT14 setup; RAN, Zeng et al. 2021, Sec. 4.1 residual 0.1 and 0.2 on its
# own attention (`ran_attention_dropout`)). None of them applies dropout inside the feed-forward layer:
# activation_dropout 0. Both bases, Marian (`swish`) and BART (`gelu`), train from scratch with this recipe; a
# warm-started model (`--init_from`) keeps its own architecture. Recorded in results.json and the model card.
PAPER_RECIPE = dict(activation_function="relu", dropout=0.1, attention_dropout=0.1, activation_dropout=0.0)
PAPER_RECIPE_CITATION = ("ReLU feed-forward, dropout 0.1 on residuals and attention weights, none in the FFN "
                         "(Vaswani et al. 2017, as trained by the ReLA, ReLUFormer and RAN papers)")
MODEL_DEFAULTS = dict(
    d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=512, scale_embedding=True, **PAPER_RECIPE,
)
# The main job's budget: a step count, not wall-clock time, so its BLEU differs between machines only by float
# rounding (the thread count changes float sums). 600 steps (about half an hour on 2 CPU cores): after 300 the
# 3+3 model still emits short or looping verses. `--minutes N` trains for a wall-clock budget instead.
DEFAULT_MAX_STEPS = 600

# config fields that are not flags: set from the tokenizer, by hf-attn, or meaningless for training
_SKIP_CONFIG_FIELDS = {
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type", "is_decoder",
    "vocab_size", "decoder_vocab_size", "pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id",
    "forced_eos_token_id", "forced_bos_token_id", "preset", "num_labels", "use_cache",
}
INIT_SCHEMES = ("marian", "xavier")
LIST_FIELDS = ("encoder_attention", "decoder_attention", "cross_attention")
LAYER_FIELDS = ("encoder_attention_layers", "decoder_attention_layers", "cross_attention_layers")


@dataclass
class HfAttnArguments:
    """hf-attn's own flags (the rest are Seq2SeqTrainingArguments and model config fields)."""

    preset: str = field(default="rela-g", metadata={"help": "attention preset (`hf-attn presets` lists them)"})
    base: str = field(default="marian", metadata={"help": "base architecture: marian or bart",
                                                  "choices": ["marian", "bart"]})
    corpus: Optional[str] = field(default=None, metadata={"help": "'bible' (the default data when no file/dataset is given)"})
    source: Optional[str] = field(default=None, metadata={"help": "source language: Bible language/translation "
                                  "code (default de = Elberfelder), or the key in the files/dataset"})
    target: Optional[str] = field(default=None, metadata={"help": "target language (Bible default en = World English Bible)"})
    train_file: Optional[str] = field(default=None, metadata={"help": "JSON lines ({'translation': {...}}), TSV or parallel-text prefix"})
    validation_file: Optional[str] = field(default=None, metadata={"help": "validation data (default: last 5%% of train)"})
    test_file: Optional[str] = field(default=None, metadata={"help": "test data (default: validation)"})
    dataset: Optional[str] = field(default=None, metadata={"help": "a `datasets` dataset with a translation column (Hub id or save_to_disk dir)"})
    dataset_config_name: Optional[str] = field(default=None, metadata={"help": "dataset config, e.g. de-en"})
    init_from: Optional[str] = field(default=None, metadata={"help": "warm-start from this vanilla Marian/BART or hf-attn checkpoint (its tokenizer too) via swap_attention"})
    minutes: Optional[float] = field(default=None, metadata={"help": f"wall-clock training budget in minutes, instead of the default {DEFAULT_MAX_STEPS} steps (with --max_steps: whichever ends first)"})
    resume: bool = field(default=False, metadata={"help": "resume from the last checkpoint in --output_dir"})
    vocab_size: int = field(default=8000, metadata={"help": "SentencePiece vocabulary size (joint, trained on the training split)"})
    spm_model_type: str = field(default="unigram", metadata={"help": "unigram or bpe", "choices": ["unigram", "bpe"]})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "use this saved tokenizer instead of training one"})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "tokenizer cache (default $HF_ATTN_CACHE or ~/.cache/hf_attn)"})
    max_source_length: int = field(default=128, metadata={"help": "longer training pairs are dropped, longer test inputs truncated"})
    max_target_length: int = field(default=128, metadata={"help": "longer training pairs are dropped"})
    max_length_ratio: Optional[float] = field(default=3.0, metadata={"help": "drop training pairs whose token lengths differ more than this factor (0: keep all)"})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "use only the first N training pairs"})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "use only the first N validation pairs"})
    max_predict_samples: Optional[int] = field(default=None, metadata={"help": "use only the first N test pairs"})
    num_beams: int = field(default=4, metadata={"help": "beam size for the test translation", "aliases": ["--beam"]})
    length_penalty: float = field(default=1.0, metadata={"help": "beam search length penalty"})
    generation_max_new_tokens: int = field(default=256, metadata={"help": "upper bound on generated tokens per sentence"})
    hub_repo_id: Optional[str] = field(default=None, metadata={"help": "with --push_to_hub: the repo (default --hub_model_id)"})
    init_scheme: str = field(default="marian", metadata={
        "help": "initialisation of a from-scratch model's attention projections and feed-forward layers: marian "
                "(N(0, init_std = 0.02), Marian's and BART's default) or xavier (xavier_uniform, gain 1/sqrt(2) on the "
                "query/key/value projections, zero biases: fairseq's Transformer, which the ReLA, ReLUFormer and "
                "calibration papers train). Variant parameters keep their own, documented init",
        "choices": list(INIT_SCHEMES)})
    noam_factor: Optional[float] = field(default=None, metadata={
        "help": "Noam schedule (Vaswani et al. 2017, Eq. 3): lr = factor * d_model**-0.5 * min(step**-0.5, step * "
                "warmup**-1.5). Sets --learning_rate to its peak factor * (d_model * warmup_steps)**-0.5 with "
                "--lr_scheduler_type inverse_sqrt (the same shape). The ReLA authors: factor 1, d_model 512, 4,000 "
                "warm-up steps (peak 7e-4)"})
    average_checkpoints: int = field(default=0, metadata={
        "help": "average the weights of the last N checkpoints (saved every --save_steps; the final step's "
                "weights count as one) before validation and the test translation, as the papers do (Vaswani et al. "
                "2017: the last 5); 0 or 1: the final weights. Keeps N checkpoints on disk"})
    eval_bleu_every: int = field(default=0, metadata={
        "help": "every N optimizer steps, translate a fixed subset of the validation split and store its BLEU and "
                "chrF in results.json (curves.validation_bleu); 0: off"})
    eval_bleu_sentences: int = field(default=200, metadata={
        "help": "with --eval_bleu_every: how many validation pairs, evenly spaced over the split"})
    eval_bleu_beams: int = field(default=1, metadata={
        "help": "with --eval_bleu_every: beam size of those translations (1: greedy)"})
    embedding_init_std: Optional[float] = field(default=None, metadata={
        "help": "std of the token embeddings at init, for a model trained from scratch (default d_model**-0.5, as in "
                "fairseq and the ReLA authors' code: unit scale after the sqrt(d_model) embedding scale; 0: the "
                "model's init_std, Marian's 0.02)"})


def _flag_type(tp) -> type | None:
    s = tp if isinstance(tp, str) else getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp)
    s = str(s)
    if any(x in s for x in ("dict", "Literal", "dtype", "list[")):
        return None
    if "bool" in s:
        return bool
    if "float" in s:
        return float
    if "int" in s:
        return int
    if "str" in s or "list" in s:
        return str
    return None


def model_config_arguments(base: str = "marian"):
    """A dataclass with one Optional field per config field of the base (and every variant hyperparameter)."""
    cfg_cls = BASES[base].config_class
    taken = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)} | {f.name for f in dataclasses.fields(HfAttnArguments)}
    specs = []
    for f in dataclasses.fields(cfg_cls):
        if f.name in _SKIP_CONFIG_FIELDS or f.name in taken or f.name.startswith("_"):
            continue
        t = _flag_type(f.type)
        if t is None:
            continue
        help_ = ("comma-separated: one variant name, or one per layer" if f.name in LIST_FIELDS else
                 "comma-separated layer indices" if f.name in LAYER_FIELDS else f"{base} config field")
        specs.append((f.name, Optional[t], field(default=None, metadata={"help": help_})))
    for hp in hyperparameters().values():
        if hp.name in taken or any(hp.name == s[0] for s in specs):
            continue
        # lists are one comma-separated value (cli/train_args.py's `type_hyperparameter_flags` applies the declared type)
        tp = str if hp.is_list else hp.type
        specs.append((hp.name, Optional[tp], field(default=None, metadata={"help": hyperparameter_help(hp)})))
    return dataclasses.make_dataclass(f"{base.capitalize()}ConfigArguments", specs)


# ---- variant hyperparameter values: help and values from text, from each variant's `hyperparameters` -----------
class _Null:
    """``--flag none`` for a nullable hyperparameter (an unset flag is None): becomes None in the overrides."""

    def __repr__(self) -> str:
        return "None"

    def __deepcopy__(self, memo):
        return self


NULL = _Null()
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def hyperparameters() -> dict:
    return declared()


def hyperparameter_help(hp) -> str:
    """``--help`` line: the declaration's help, type, valid values and default."""
    text = f"{hp.help} [{hp.type_name()}: {hp.valid_values()}; default {hp.initial()!r}]"
    return text.replace("%", "%%")


def hyperparameter_from_text(hp, text: str):
    """A flag's text as the declared type: ``512``, ``0.1``, ``true``/``false``, ``-2,2`` or ``[-2, 2]``, ``none``
    (nullable only); text that does not parse comes back unchanged, for `Hyperparameter.check` to name it."""
    t = text.strip()
    if hp.nullable and t.lower() in ("none", "null"):
        return NULL
    if hp.type is bool:
        return True if t.lower() in _TRUE else False if t.lower() in _FALSE else text
    if hp.type is str:
        return t
    try:
        if hp.is_list:
            items = t[1:-1] if t.startswith("[") and t.endswith("]") else t
            return [hp.element_type(x) for x in items.replace(",", " ").split()]
        return hp.type(t)
    except ValueError:
        return text


def model_overrides(cfg_args) -> dict:
    """The config fields given on the command line, with comma lists parsed."""
    out = {}
    for k, v in dataclasses.asdict(cfg_args).items():
        if v is None:
            continue
        if v is NULL:
            v = None
        if k in LIST_FIELDS and isinstance(v, str) and "," in v:
            v = [x.strip() for x in v.split(",") if x.strip()]
        elif k in LAYER_FIELDS and isinstance(v, str):
            try:
                v = [int(x) for x in v.split(",") if x.strip()]
            except ValueError:
                raise HfAttnInputError(f"--{k} {v!r}: give comma-separated layer indices such as 0,2") from None
        out[k] = v
    return out
