"""The main job: data -> tokenizer -> model -> Trainer -> test translation -> results.json + Hub-ready directory.

Used by ``hf-attn train`` / ``evaluate`` / ``translate``; works unchanged under ``accelerate launch`` (DDP):
every process trains, the main process trains the tokenizer first and alone writes files and decodes the test set.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import TrainerState, set_seed

from ..analysis.viewer import write_run_viewer
from ..bench.memory import keep_freed_memory, peak_rss_mib
from ..data import get_tokenizer, load_corpus, load_tokenizer, make_collator, special_token_config, tokenize_split
from ..errors import HfAttnInputError, HfAttnPreempted
from ..generation import decoding_settings, translate_texts
from ..io_utils import ensure_writable_dir, write_json
from ..modeling import PRESETS
from ..modeling.bases import BASES, base_of
from ..rundir import load_model_dir, read_run_args, run_pairs
from .args import MODEL_DEFAULTS, PAPER_RECIPE, PAPER_RECIPE_CITATION
from .cards import trainable_parameters, write_model_card
from .checkpoints import RunLock, average_last_checkpoints, newest_complete_checkpoint
from .convert import swapped_model
from .hub import push_model_dir
from .metrics import Seq2SeqMetrics, score_translations
from .reference import reference_for
from .trainer import HfAttnSeq2SeqTrainer, StopOnSignalCallback, TimeBudgetCallback
from .validate import check_cache_dir, check_model_flags, check_train_flags

logger = logging.getLogger("hf_attn")


def say(msg: str) -> None:
    """A progress line, from the main process only when several are launched (accelerate/torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"[hf-attn] {msg}", flush=True)


def configure_generation(model, tokenizer, base: str, num_beams: int, length_penalty: float, max_length: int) -> None:
    gc = model.generation_config
    gc.num_beams = num_beams
    gc.length_penalty = length_penalty
    gc.max_length = max_length
    gc.early_stopping = num_beams > 1
    gc.pad_token_id = tokenizer.pad_token_id
    gc.eos_token_id = tokenizer.eos_token_id
    if base == "marian":
        gc.decoder_start_token_id = tokenizer.pad_token_id
        gc.forced_eos_token_id = tokenizer.eos_token_id
        gc.bad_words_ids = [[tokenizer.pad_token_id]]
    else:
        gc.bos_token_id = tokenizer.bos_token_id
        gc.decoder_start_token_id = tokenizer.eos_token_id
        gc.forced_bos_token_id = tokenizer.bos_token_id
        gc.forced_eos_token_id = tokenizer.eos_token_id


def embedding_std(config, std: float | None) -> float:
    """The token-embedding init std of a from-scratch run: --embedding_init_std, d_model**-0.5 when not given,
    the model's init_std for 0."""
    if std is None:
        return round(config.d_model ** -0.5, 6)
    return std or config.init_std


def init_embeddings(model, std: float | None) -> float:
    """Re-draw the (shared, tied) token embeddings from N(0, std), std = d_model**-0.5 by default, as fairseq and
    the ReLA authors' zero toolkit do; with the sqrt(d_model) embedding scale the tokens then enter at unit scale,
    like the sinusoidal positions. Marian's N(0, 0.02) leaves them 3x smaller, and ReLA-g then never learns to read
    the source within the main job's 600 steps (BLEU 0.9; its loss is the same with shuffled sources)."""
    std = embedding_std(model.config, std)
    if std == model.config.init_std:
        return std
    emb = model.get_input_embeddings()
    with torch.no_grad():
        emb.weight.normal_(0.0, std)
        if emb.padding_idx is not None:
            emb.weight[emb.padding_idx].zero_()
    return std


# fairseq's Transformer: MultiheadAttention.reset_parameters (xavier_uniform, gain 1/sqrt(2) on q/k/v when the three
# have one size; out_proj gain 1, bias 0) and its `Linear` helper for the feed-forward layers (xavier_uniform, bias 0)
_XAVIER_GAINS = {"q_proj": 2 ** -0.5, "k_proj": 2 ** -0.5, "v_proj": 2 ** -0.5, "out_proj": 1.0, "fc1": 1.0, "fc2": 1.0}


def init_layers(model, scheme: str) -> int:
    """Re-initialise the attention projections and feed-forward layers of every encoder/decoder layer with
    ``scheme`` ("xavier": fairseq's init, `_XAVIER_GAINS`, zero biases; "marian": leave the model's N(0, init_std)).
    Variant parameters (GMM's FFNs, calibration's mask network, ReLA's gains, RAN's maps) keep their own init, and
    so do the embeddings (`init_embeddings`). Returns the number of layers re-initialised."""
    if scheme == "marian":
        return 0
    count = 0
    with torch.no_grad():
        for name, module in model.named_modules():
            parts = name.split(".")
            if not isinstance(module, torch.nn.Linear) or "layers" not in parts or parts[-1] not in _XAVIER_GAINS:
                continue
            torch.nn.init.xavier_uniform_(module.weight, gain=_XAVIER_GAINS[parts[-1]])
            if module.bias is not None:
                module.bias.zero_()
            count += 1
    return count


def noam_learning_rate(factor: float, d_model: int, warmup_steps: int) -> float:
    """The Noam schedule's peak (Vaswani et al. 2017, Eq. 3), reached at step ``warmup_steps``:
    factor * d_model**-0.5 * warmup**-0.5. After the peak it decays as step**-0.5, which is transformers'
    inverse_sqrt schedule."""
    return factor * (d_model * warmup_steps) ** -0.5


def check_noam(hargs, targs, given: set) -> None:
    """--noam_factor's companions, checked before any work: no --learning_rate, the inverse_sqrt shape, a warm-up."""
    if not hargs.noam_factor:
        return
    sched = str(getattr(targs.lr_scheduler_type, "value", targs.lr_scheduler_type))
    if "learning_rate" in given:
        raise HfAttnInputError(f"--noam_factor {hargs.noam_factor} sets the learning rate (factor * (d_model * "
                               "warmup_steps)**-0.5); drop --learning_rate")
    if sched != "inverse_sqrt":
        raise HfAttnInputError(f"--noam_factor needs --lr_scheduler_type inverse_sqrt (the Noam shape), not {sched!r}")
    if not targs.warmup_steps or targs.warmup_steps < 1:
        raise HfAttnInputError(f"--noam_factor needs --warmup_steps >= 1 (the step of the peak), not {targs.warmup_steps}")


def apply_noam(hargs, targs, d_model: int, given: set) -> None:
    """--noam_factor: the learning rate becomes the Noam peak for this d_model and --warmup_steps."""
    check_noam(hargs, targs, given)
    targs.learning_rate = noam_learning_rate(hargs.noam_factor, d_model, int(targs.warmup_steps))


def scaled_anneal(preset: str, max_steps: int, overrides: dict) -> dict:
    """Attention calibration's annealing ratio r = exp(-step / T) (Lu et al. 2021, Eq. 9) uses T = 1e5 for runs of
    150k steps, so r ends at exp(-1.5) = 0.22. Under a shorter step budget the same T leaves r >= 0.99: the run would
    be the baseline. A from-scratch run with an annealing preset therefore gets T = max_steps / 1.5 (the paper's end
    ratio), unless --calibration_anneal_steps is given or the budget is wall-clock time."""
    fusion = overrides.get("calibration_fusion", PRESETS[preset].overrides.get("calibration_fusion"))
    if fusion != "anneal" or "calibration_anneal_steps" in overrides or max_steps <= 0:
        return {}
    return {"calibration_anneal_steps": round(max_steps / 1.5, 1)}


def _last_checkpoint(output_dir: Path) -> str | None:
    return newest_complete_checkpoint(output_dir)[0]


def _device_name(targs, kept_memory: bool = False) -> str:
    dev = str(targs.device)
    if dev.startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} x{max(1, targs.world_size)}"
    return (f"{platform.machine()} CPU, {torch.get_num_threads()} threads x {max(1, targs.world_size)} process(es)"
            + (", malloc keeps freed memory" if kept_memory else ""))


def _prepare_output_dir(out_dir: Path, hargs, given: set) -> tuple[Path, str | None]:
    """The output directory and the checkpoint to resume from (the newest complete one; incomplete newer ones are
    named and skipped); on --resume the interrupted run's data/preset/base flags are taken from run_args.json."""
    last, skipped = newest_complete_checkpoint(out_dir)
    note = f" (skipped incomplete {', '.join(skipped)})" if skipped else ""
    if hargs.resume and last is None:
        raise HfAttnInputError(f"--resume: {str(out_dir)!r} holds no checkpoint-* directory that is complete, to resume from"
                               f"{note}; run without --resume")
    if last is not None and not hargs.resume:
        raise HfAttnInputError(
            f"--output_dir {str(out_dir)!r} already holds {Path(last).name}{note}; pass --resume to continue that run "
            "or choose an empty --output_dir"
        )
    if hargs.resume:
        for name in skipped:
            say(f"skipping incomplete {name} (a save that did not finish)")
        prev = read_run_args(out_dir)  # the resumed run uses the interrupted run's data, preset and base
        for k in RESUMED_FLAGS:
            if k not in given and k in prev:
                setattr(hargs, k, prev[k])
        say(f"resuming from {last}")
    return out_dir, last


RESUMED_FLAGS = ("preset", "base", "corpus", "source", "target", "train_file", "validation_file", "test_file", "dataset",
                 "dataset_config_name", "vocab_size", "spm_model_type", "max_train_samples", "max_source_length",
                 "max_target_length", "max_length_ratio", "init_from", "tokenizer_name", "embedding_init_std",
                 "init_scheme", "noam_factor", "average_checkpoints")


def train(hargs, targs, overrides: dict | None = None, given: set | None = None, extra_callbacks=None) -> dict | None:
    """Run the main job; returns the results dict on the main process (None on the others).

    Every flag is checked first; the output directory is then locked (one run at a time) until the run ends."""
    check_train_flags(hargs, targs)
    out_dir = ensure_writable_dir(targs.output_dir)
    with RunLock(out_dir):
        return _train(out_dir, hargs, targs, overrides, given, extra_callbacks)


def _run_tokenizer(hargs, targs, out_dir: Path, corpus, base: str):
    """(tokenizer, description): the interrupted run's on --resume, a saved one (--tokenizer_name/--init_from), or a
    SentencePiece model trained on the training split (cached)."""
    tok_source = None
    if hargs.resume and (out_dir / "tokenizer_config.json").is_file():
        tokenizer, tok_source = load_tokenizer(out_dir), str(out_dir)
    elif hargs.tokenizer_name or hargs.init_from:
        tok_source = hargs.tokenizer_name or hargs.init_from
        try:
            tokenizer = load_tokenizer(tok_source)
        except (OSError, ValueError) as e:
            raise HfAttnInputError(f"cannot load a tokenizer from {tok_source!r} ({str(e).splitlines()[0][:150]}); "
                                   "give a directory with tokenizer files") from None
    else:
        src, tgt = corpus.pairs("train")
        with targs.main_process_first(desc="tokenizer training"):
            tokenizer, tok_path = get_tokenizer(src + tgt, base=base, vocab_size=hargs.vocab_size,
                                                model_type=hargs.spm_model_type, cache_dir=hargs.cache_dir,
                                                seed=targs.seed)
        tok_source = str(tok_path)
    tokenizer_info = f"{hargs.spm_model_type} {len(tokenizer):,} tokens" if not hargs.init_from else f"from {tok_source}"

    return tokenizer, tokenizer_info


def _build_model(hargs, targs, last, overrides: dict, tokenizer, base: str):
    """(model, base, token-embedding init std): from the checkpoint on --resume, warm-started with --init_from, or
    from scratch with the preset; generation settings configured."""
    cfg_cls, model_cls = BASES[base].config_class, BASES[base].model_class
    defaults = MODEL_DEFAULTS
    embedding_init_std = None  # a warm-started run keeps its embeddings
    if hargs.resume:
        model = model_cls.from_pretrained(last)
        if not hargs.init_from:
            embedding_init_std = embedding_std(model.config, hargs.embedding_init_std)
    elif hargs.init_from:
        model = swapped_model(hargs.init_from, hargs.preset, tokenizer, f"--init_from {hargs.init_from!r}", **overrides)
        base = (base_of(model.config) or BASES["marian"]).name
    else:
        kw = {**defaults, **special_token_config(tokenizer, base), **scaled_anneal(hargs.preset, targs.max_steps, overrides),
              **overrides}
        config = cfg_cls.from_preset(hargs.preset, **kw)
        model = model_cls(config)
        embedding_init_std = init_embeddings(model, hargs.embedding_init_std)
        init_layers(model, hargs.init_scheme)
    configure_generation(model, tokenizer, base, hargs.num_beams, hargs.length_penalty,
                         max_length=hargs.generation_max_new_tokens + 2)
    return model, base, embedding_init_std


def _fit(trainer, hargs, targs, last, out_dir: Path) -> tuple[bool, float, int]:
    """Train (or skip a finished checkpoint); (done before, training seconds, target tokens over all processes).
    Ctrl-C and a non-finite loss end here with one line that says how to go on."""
    t_train = time.time()
    done = _finished_checkpoint(last, targs.max_steps) if hargs.resume else False
    try:
        if done:  # the run finished training and stopped later (test decoding): Trainer would take one more step
            trainer.state = TrainerState.load_from_json(str(Path(last) / "trainer_state.json"))
            say(f"{Path(last).name} already reached --max_steps {targs.max_steps}: no more training")
        else:
            trainer.train(resume_from_checkpoint=last if hargs.resume else None)
    except KeyboardInterrupt:
        ck = _last_checkpoint(out_dir)
        raise HfAttnInputError(
            f"training interrupted at step {trainer.state.global_step}; "
            + (f"resume from {Path(ck).name} with the same command plus --resume" if ck else
               "no checkpoint was saved yet (lower --save_steps)")
        ) from None
    stopped = next((cb.signal_name for cb in trainer.callback_handler.callbacks
                    if isinstance(cb, StopOnSignalCallback) and cb.signal_name), None)
    if stopped:
        raise HfAttnPreempted(preempted_message(stopped, trainer.state.global_step, _last_checkpoint(out_dir)))
    train_seconds = 0.0 if done else time.time() - t_train
    tokens = trainer.train_target_tokens
    if targs.world_size > 1 and torch.distributed.is_initialized():
        t = torch.tensor([float(tokens)])
        torch.distributed.all_reduce(t)
        tokens = int(t.item())
    if trainer.diverged is not None:
        step, loss = trainer.diverged
        raise HfAttnInputError(
            f"training diverged: loss {loss} at step {step}" + (f" of {targs.max_steps}" if targs.max_steps > 0 else "")
            + f"; lower --learning_rate (now {targs.learning_rate}) or raise --warmup_steps (now {targs.warmup_steps}), "
            f"and start again in an empty --output_dir"
        )
    return done, train_seconds, tokens


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


def preempted_message(signal_name: str, step: int, checkpoint: str | None) -> str:
    """The line `hf-attn train` ends with when a signal stopped it: the checkpoint and the command that resumes."""
    argv = sys.argv[1:]
    if argv[:1] == ["train"] and "--resume" not in argv:
        again = f"`{shlex.join(['hf-attn', *argv, '--resume'])}`"
    else:  # already a --resume, or a run of `hf-attn reproduce`
        again = "the same command"
    return (f"stopped by {signal_name} at step {step}, checkpoint saved: {checkpoint}; resume with {again}"
            if checkpoint else f"stopped by {signal_name} at step {step} before any checkpoint was saved")


def _finish(c) -> dict:
    """Translate and score the test split, write results.json and the model card, push if asked (main process)."""
    hargs, targs, out_dir = c.hargs, c.targs, c.out_dir
    model = c.trainer.model
    model.eval()
    src_test, ref_test = c.corpus.pairs("test")
    say(f"translating the test split ({len(src_test):,} sentences, beam {hargs.num_beams})")
    t_dec = time.time()
    hyps = translate_texts(model, c.tokenizer, src_test, num_beams=hargs.num_beams, length_penalty=hargs.length_penalty,
                           batch_size=targs.per_device_eval_batch_size, max_source_length=hargs.max_source_length,
                           max_new_tokens=hargs.generation_max_new_tokens, desc="test")
    c.dec_seconds = time.time() - t_dec
    c.scores = score_translations(hyps, ref_test)
    (out_dir / "test_translations.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    run = _results(c, model, src_test, hyps)
    run["reference"] = reference_for(run)
    run["warnings"] = evaluation_warnings(c.corpus.pairs("train")[0], src_test, hyps)
    for warning in run["warnings"]:
        say(f"warning: {warning}")
    write_json(out_dir / "results.json", run, default=str)
    written = write_run_viewer(out_dir, model, c.tokenizer, src_test, ref_test, hyps,
                               description=f"test split of {c.corpus.description}",
                               max_tokens=min(64, hargs.max_source_length, hargs.max_target_length))
    say(f"attention viewer: {', '.join(p.name for p in written)} (open viewer.html in a browser)" if written
        else "no test pairs: no attention viewer")
    write_model_card(out_dir, hargs.hub_repo_id or targs.hub_model_id)
    say(summary_line(run))
    if c.push_after:
        repo = hargs.hub_repo_id or targs.hub_model_id
        info = push_model_dir(out_dir, repo, private=targs.hub_private_repo, token=targs.hub_token)
        say(f"pushed to {getattr(info, 'commit_url', repo)}")
    return run


def _last_aux(log_history: list[dict], val: dict) -> dict:
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


def _results(c, model, src_test: list[str], hyps: list[str]) -> dict:
    """results.json (strict JSON once written: a non-finite number becomes null)."""
    hargs, targs, trainer, corpus, scores, val = c.hargs, c.targs, c.trainer, c.corpus, c.scores, c.val
    train_seconds, tokens, dec_seconds = c.train_seconds, c.tokens, c.dec_seconds
    last_train_loss = c.loss_hist[-1] if c.loss_hist else None
    last_aux = _last_aux(trainer.state.log_history, val)
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
        "device": _device_name(targs, c.kept_memory), "world_size": targs.world_size,
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
    run["training"]["lr_scheduler_type"] = str(getattr(targs.lr_scheduler_type, "value", targs.lr_scheduler_type))
    run["training"]["embedding_init_std"] = c.embedding_init_std
    run["training"].update(init_scheme=hargs.init_scheme, noam_factor=hargs.noam_factor,
                           averaged_checkpoints=c.averaged,
                           torch_compile_backend=targs.torch_compile_backend if targs.torch_compile else None)
    return run


def _make_trainer(hargs, targs, model, tokenizer, train_ds, eval_ds, last, extra_callbacks):
    if targs.predict_with_generate and targs.eval_strategy != "no":
        targs.generation_num_beams = targs.generation_num_beams or hargs.num_beams
    budget = TimeBudgetCallback(hargs.minutes, TimeBudgetCallback.elapsed_in(last if hargs.resume else None))
    trainer = HfAttnSeq2SeqTrainer(
        model=model, args=targs, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=tokenizer,
        data_collator=make_collator(tokenizer, model),
        compute_metrics=Seq2SeqMetrics(tokenizer) if targs.predict_with_generate else None,
        callbacks=[budget, StopOnSignalCallback(), *(extra_callbacks or [])],
    )
    budget.trainer = trainer
    return trainer, budget


def _train(out_dir: Path, hargs, targs, overrides, given, extra_callbacks) -> dict | None:
    """Data -> tokenizer -> model -> Trainer -> validation loss and the saved model -> `_finish` (test, results)."""
    overrides = dict(overrides or {})
    given = set(given or ())
    t_start = time.time()
    out_dir, last = _prepare_output_dir(out_dir, hargs, given)
    check_model_flags(hargs, overrides, resume=hargs.resume)
    check_noam(hargs, targs, given)
    check_cache_dir(hargs, trains_tokenizer=not (hargs.tokenizer_name or hargs.init_from or (
        hargs.resume and (out_dir / "tokenizer_config.json").is_file())))
    set_seed(targs.seed)
    kept_memory = str(targs.device) == "cpu" and keep_freed_memory()  # no page faults per step (bench/memory.py)
    base = hargs.base

    # ---------------------------------------------------------------------------------------------- data
    limits = {"train": hargs.max_train_samples, "validation": hargs.max_eval_samples, "test": hargs.max_predict_samples}
    corpus = load_corpus(hargs.corpus, hargs.source, hargs.target, hargs.train_file, hargs.validation_file,
                         hargs.test_file, hargs.dataset, hargs.dataset_config_name, limits)
    say(f"data: {corpus.description}; pairs: " + ", ".join(f"{k} {v:,}" for k, v in corpus.sizes().items()))

    tokenizer, tokenizer_info = _run_tokenizer(hargs, targs, out_dir, corpus, base)

    model, base, embedding_init_std = _build_model(hargs, targs, last, overrides, tokenizer, base)
    n_params = trainable_parameters(model)
    model.config.hf_attn_card = {  # kept in config.json: the card of any later save (a Trainer's) says the same
        "origin": f"trained by `hf-attn train` on {corpus.description}",
        "languages": [x for x in (corpus.source_lang, corpus.target_lang) if x],
        "base_model": hargs.init_from if hargs.init_from and not Path(hargs.init_from).is_dir() else None}
    say(f"model: {type(model).__name__} preset {model.config.preset or hargs.preset}, {n_params / 1e6:.2f}M trainable parameters, "
        f"d_model {model.config.d_model}, {model.config.encoder_layers}+{model.config.decoder_layers} layers")

    # ---------------------------------------------------------------------------------------------- tokenise
    ratio = hargs.max_length_ratio or None
    train_ds = tokenize_split(corpus.splits["train"], tokenizer, corpus.source_lang, corpus.target_lang,
                              hargs.max_source_length, hargs.max_target_length, filter_long=True,
                              max_length_ratio=ratio, desc="tokenizing train")
    eval_ds = tokenize_split(corpus.splits["validation"], tokenizer, corpus.source_lang, corpus.target_lang,
                             hargs.max_source_length, hargs.max_target_length, filter_long=False,
                             desc="tokenizing validation")

    if hargs.noam_factor:
        apply_noam(hargs, targs, model.config.d_model, given)
    if hargs.average_checkpoints > 1 and targs.save_total_limit is not None:
        targs.save_total_limit = max(targs.save_total_limit, hargs.average_checkpoints)
    push_after = bool(targs.push_to_hub)
    targs.push_to_hub = False  # we push the finished directory ourselves (card, results, no checkpoints)
    trainer, budget = _make_trainer(hargs, targs, model, tokenizer, train_ds, eval_ds, last, extra_callbacks)
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(out_dir)
        write_json(out_dir / "run_args.json", {"hf_attn": dataclasses.asdict(hargs), "model_overrides": overrides,
                                               "training": targs.to_dict()}, default=str)
    plan = f"{hargs.minutes:g} minutes" if hargs.minutes else f"{targs.max_steps} steps" if targs.max_steps > 0 \
        else f"{targs.num_train_epochs:g} epochs"
    say(f"training {hargs.preset} for {plan} (batch {targs.per_device_train_batch_size} x {targs.gradient_accumulation_steps} "
        f"accumulation x {targs.world_size} process(es), lr {targs.learning_rate}, {targs.lr_scheduler_type})")
    done, train_seconds, tokens = _fit(trainer, hargs, targs, last, out_dir)
    averaged = None
    if hargs.average_checkpoints > 1:
        averaged = average_last_checkpoints(trainer.model, out_dir, hargs.average_checkpoints, trainer.state.global_step)
        say(f"averaged the weights of {len(averaged)} checkpoints: {', '.join(averaged)}")
    loss_hist = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    val = trainer.evaluate(metric_key_prefix="validation")
    trainer.save_model(str(out_dir))  # every process calls it (FSDP/DeepSpeed gather); only the main one writes
    if not trainer.is_world_process_zero():
        return None

    return _finish(SimpleNamespace(
        trainer=trainer, tokenizer=tokenizer, corpus=corpus, hargs=hargs, targs=targs, out_dir=out_dir, base=base,
        overrides=overrides, n_params=n_params, train_ds=train_ds, eval_ds=eval_ds, val=val, loss_hist=loss_hist,
        budget=budget, plan=plan, train_seconds=train_seconds, tokens=tokens, tokenizer_info=tokenizer_info,
        embedding_init_std=embedding_init_std, t_start=t_start, push_after=push_after, kept_memory=kept_memory,
        averaged=averaged))

def loss_curves(log_history: list[dict], final_step: int, final_validation_loss) -> dict:
    """``{"train_loss": [[step, loss], ...], "validation_loss": [[step, loss], ...]}`` from Trainer's log history
    (the validation loss every ``eval_steps`` and after training)."""
    val = [[h["step"], h["eval_loss"]] for h in log_history if "eval_loss" in h]
    if final_validation_loss is not None and (not val or val[-1][0] != final_step):
        val.append([final_step, final_validation_loss])
    return {"train_loss": [[h["step"], h["loss"]] for h in log_history if "loss" in h], "validation_loss": val}


def _finished_checkpoint(ckpt, max_steps: int) -> bool:
    """True when checkpoint ``ckpt`` already holds ``max_steps`` optimizer steps (so resuming it trains no more)."""
    state = Path(ckpt) / "trainer_state.json"
    if max_steps <= 0 or not state.is_file():
        return False
    return int(json.loads(state.read_text()).get("global_step", 0)) >= max_steps


def summary_line(run: dict) -> str:
    s = (f"{run['preset']}: BLEU {run['bleu']:.1f} / chrF {run['chrf']:.1f} on {run['test_sentences']} test sentences "
         f"({run['source_lang']}->{run['target_lang']}, beam {run['num_beams']}) after {run['train_steps']} steps, "
         f"{run['train_minutes']} min, {run['tokens_per_second']} tok/s")
    ref = run.get("reference")
    if ref:
        s += (f" | softmax reference: BLEU {ref['bleu']:.1f} / chrF {ref['chrf']:.1f} "
              f"({ref.get('steps', '?')} steps on {ref.get('device', 'a 2-core CPU')})")
    return s + f" | signature {run['bleu_signature']}"


# -------------------------------------------------------------------------------------------------- re-scoring
def evaluate_dir(model_dir: str, split: str = "test", test_file: str | None = None, source=None, target=None,
                 num_beams: int | None = None, length_penalty: float | None = None, batch_size: int = 32,
                 max_samples: int | None = None, write: bool = True) -> dict:
    """Re-score a saved model on its run's split (Bible/files/dataset from run_args.json) or on a file."""
    d = Path(model_dir)
    model, tokenizer = load_model_dir(model_dir)
    src, ref, what, prev = run_pairs(model_dir, split, test_file, source, target, max_samples)
    beams, lp = decoding_settings(model, num_beams, length_penalty)
    say(f"translating {len(src):,} sentences ({what}), beam {beams}")
    t0 = time.time()
    hyps = translate_texts(model, tokenizer, src, num_beams=beams, length_penalty=lp, batch_size=batch_size,
                           max_source_length=prev.get("max_source_length", 256))
    scores = score_translations(hyps, ref)
    out = {"model_dir": str(d), "data": what, "bleu": scores["bleu"], "chrf": scores["chrf"],
           "bleu_signature": scores["bleu_signature"], "chrf_signature": scores["chrf_signature"],
           "sentences": len(src), "num_beams": beams, "length_penalty": lp, "decode_seconds": round(time.time() - t0, 1)}
    if write:
        try:
            write_json(d / "evaluate_results.json", out)
        except OSError as e:  # a read-only model directory: the scores are returned (and printed) all the same
            say(f"could not write {d / 'evaluate_results.json'} ({e.strerror or e}); the scores are not saved there")
    return out
