"""``results.json``: the record of one finished run (scores, losses and curves, speeds, the recipe, the machine), the
warnings that say when its test score means little, and its one-line summary."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..bench.memory import peak_rss_mib
from .args import PAPER_RECIPE, PAPER_RECIPE_CITATION

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, Seq2SeqTrainingArguments

    from ..data import Corpus
    from .args import HfAttnArguments
    from .trainer import HfAttnSeq2SeqTrainer, TimeBudgetCallback


@dataclass
class TrainedRun:
    """A run after training, on the main process: what the test translation and `results_record` read."""

    trainer: HfAttnSeq2SeqTrainer
    tokenizer: PreTrainedTokenizerBase
    corpus: Corpus
    hargs: HfAttnArguments
    targs: Seq2SeqTrainingArguments
    out_dir: Path
    base: str  # "marian" or "bart" (a warm start's own)
    overrides: dict  # model config overrides given on the command line
    n_params: int  # trainable parameters
    train_ds: Dataset
    eval_ds: Dataset
    val: dict  # the final validation metrics ("validation_loss", ...)
    loss_hist: list[float]  # the logged training losses
    budget: TimeBudgetCallback
    plan: str  # the budget in words: "600 steps", "10 minutes", "3 epochs"
    train_seconds: float  # training time of this process (0 when a finished checkpoint was resumed)
    tokens: int  # target tokens trained on, over all processes
    tokenizer_info: str
    embedding_init_std: float | None  # None: the embeddings were not drawn again (warm start)
    t_start: float  # time.time() when the run started
    push_after: bool  # push the finished directory to the Hub
    kept_memory: bool  # malloc keeps freed memory (`bench.memory.keep_freed_memory`)
    averaged: list[str] | None  # the checkpoints averaged into the final weights


MIN_TEST_SENTENCES = 100  # under this, a corpus BLEU's bootstrap interval spans several points


def evaluation_warnings(train_sources: list[str], test_sources: list[str], hypotheses: list[str]) -> list[str]:
    """What makes a test score mean little, each as one sentence: a test split too small for a stable BLEU, test
    sources that also occur in the training split (the score then measures memory), and empty translations."""
    out = []
    n = len(test_sources)
    if 0 < n < MIN_TEST_SENTENCES:
        out.append(f"the test split has {n} sentences (under {MIN_TEST_SENTENCES}): its BLEU moves by several points "
                   "with the choice of sentences; give a larger --test_file or --max_predict_samples")
    seen = set(train_sources)
    overlap = sum(src in seen for src in test_sources)
    if overlap:
        out.append(f"{overlap} of the {n} test sources also occur in the training split: the score overstates "
                   "translation of unseen text; deduplicate the splits")
    empty = sum(not h.strip() for h in hypotheses)
    if hypotheses and empty / len(hypotheses) > 0.1:
        out.append(f"{empty} of the {len(hypotheses)} translations are empty: the model has not learned to translate "
                   "yet (train longer), or generation stops at once (check --generation_max_new_tokens)")
    return out


def summary_line(run: dict) -> str:
    s = (f"{run['preset']}: BLEU {run['bleu']:.1f} / chrF {run['chrf']:.1f} on {run['test_sentences']} test sentences "
         f"({run['source_lang']}->{run['target_lang']}, beam {run['num_beams']}) after {run['train_steps']} steps, "
         f"{run['train_minutes']} min, {run['tokens_per_second']} tok/s")
    ref = run.get("reference")
    if ref:
        s += (f" | softmax reference: BLEU {ref['bleu']:.1f} / chrF {ref['chrf']:.1f} "
              f"({ref.get('steps', '?')} steps on {ref.get('device', 'a 2-core CPU')})")
    return s + f" | signature {run['bleu_signature']}"


def loss_curves(log_history: list[dict], final_step: int, final_validation_loss) -> dict:
    """``{"train_loss": [[step, loss], ...], "validation_loss": [[step, loss], ...]}`` from Trainer's log history
    (the validation loss every ``eval_steps`` and after training)."""
    val = [[h["step"], h["eval_loss"]] for h in log_history if "eval_loss" in h]
    if final_validation_loss is not None and (not val or val[-1][0] != final_step):
        val.append([final_step, final_validation_loss])
    return {"train_loss": [[h["step"], h["loss"]] for h in log_history if "loss" in h], "validation_loss": val}


def last_aux_logs(log_history: list[dict], val: dict) -> dict:
    """The last logged value of each auxiliary-loss column."""
    aux_keys = sorted({k for h in log_history for k in h if k not in (
        "loss", "learning_rate", "grad_norm", "epoch", "step")} - {k for k in val} - {
        "train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"})
    last_aux = {}
    for h in log_history:
        for k in aux_keys:
            if k in h:
                last_aux[k] = h[k]
    return last_aux


def device_name(targs, kept_memory: bool = False) -> str:
    dev = str(targs.device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} x{max(1, targs.world_size)}"
    return (f"{platform.machine()} CPU, {torch.get_num_threads()} threads x {max(1, targs.world_size)} process(es)"
            + (", malloc keeps freed memory" if kept_memory else ""))


def results_record(c: TrainedRun, model, src_test: list[str], hyps: list[str], scores: dict,
                   dec_seconds: float) -> dict:
    """results.json (strict JSON once written: a non-finite number becomes null), from the trained run, its test
    translations ``hyps`` of ``src_test``, their ``scores`` and the decoding time."""
    hargs, targs, trainer, corpus, val = c.hargs, c.targs, c.trainer, c.corpus, c.val
    train_seconds, tokens = c.train_seconds, c.tokens
    last_train_loss = c.loss_hist[-1] if c.loss_hist else None
    last_aux = last_aux_logs(trainer.state.log_history, val)
    run = {
        "preset": hargs.preset, "base": c.base, "model_class": type(model).__name__,
        "source_lang": corpus.source_lang, "target_lang": corpus.target_lang,
        "data": corpus.info, "data_description": corpus.description, "sizes": {
            "train": len(c.train_ds), "validation": len(c.eval_ds), "test": len(src_test),
            "train_before_filtering": corpus.sizes()["train"]},
        "bleu": scores["bleu"], "chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"],
        "chrf_signature": scores["chrf_signature"], "bleu_details": scores["bleu_details"],
        "test_sentences": len(src_test), "num_beams": hargs.num_beams, "length_penalty": hargs.length_penalty,
        "validation_loss": round(val.get("validation_loss", float("nan")), 4),
        "train_loss": last_train_loss, "aux_logs": last_aux,
        "curves": loss_curves(trainer.state.log_history, trainer.state.global_step, val.get("validation_loss")),
        "params": c.n_params, "train_steps": trainer.state.global_step,
        "epochs": round(float(trainer.state.epoch or 0), 3),
        "minutes": hargs.minutes, "budget": c.plan,
        "train_minutes": round((c.budget.elapsed() if hargs.minutes else train_seconds) / 60, 2),
        "train_seconds_this_run": round(train_seconds, 1),
        "tokens_per_second": round(tokens / train_seconds, 1) if train_seconds > 0 else None,
        "decode_seconds": round(dec_seconds, 1),
        "decode_sentences_per_second": round(len(src_test) / dec_seconds, 2) if dec_seconds > 0 else None,
        "total_seconds": round(time.time() - c.t_start, 1),
        "device": device_name(targs, c.kept_memory), "world_size": targs.world_size,
        "peak_rss_mib": peak_rss_mib(),
        "model_config": {k: getattr(model.config, k, None) for k in (
            "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "encoder_ffn_dim", "vocab_size",
            "activation_function", "dropout", "attention_dropout", "activation_dropout", "scale_embedding",
            "init_std")},
        "recipe": PAPER_RECIPE_CITATION if not hargs.init_from and all(
            getattr(model.config, k, None) == v for k, v in PAPER_RECIPE.items()) else None,
        "attention_layout": model.config.attention_layout() if hasattr(model.config, "attention_layout") else None,
        "training": {k: getattr(targs, k) for k in (
            "learning_rate", "lr_scheduler_type", "warmup_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps", "label_smoothing_factor", "adam_beta1", "adam_beta2", "weight_decay",
            "max_grad_norm", "seed", "world_size", "torch_compile")},
        "init_from": hargs.init_from, "tokenizer_info": c.tokenizer_info, "max_source_length": hargs.max_source_length,
        "example_source": src_test[0] if src_test else None, "example_translation": hyps[0] if hyps else None,
        "default_model_size": not any(k in c.overrides for k in ("d_model", "encoder_layers", "decoder_layers",
                                                                "encoder_ffn_dim", "encoder_attention_heads"))
                              and hargs.init_from is None,
        "output_dir": str(c.out_dir),
    }
    bleu_curve = next((cb for cb in trainer.callback_handler.callbacks if hasattr(cb, "curve")), None)
    if bleu_curve is not None:  # --eval_bleu_every (`bleu_curve.ValidationBleuCallback`)
        run["curves"]["validation_bleu"] = bleu_curve.record()
    run["training"]["lr_scheduler_type"] = str(getattr(targs.lr_scheduler_type, "value", targs.lr_scheduler_type))
    run["training"]["embedding_init_std"] = c.embedding_init_std
    run["training"].update(init_scheme=hargs.init_scheme, noam_factor=hargs.noam_factor,
                           averaged_checkpoints=c.averaged,
                           torch_compile_backend=targs.torch_compile_backend if targs.torch_compile else None)
    return run
