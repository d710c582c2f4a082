"""The main job: data -> tokenizer -> model -> Trainer -> test translation -> results.json + Hub-ready directory.

Used by ``hf-attn train`` / ``evaluate`` / ``translate``; works unchanged under ``accelerate launch`` (DDP):
every process trains, the main process trains the tokenizer first and alone writes files and decodes the test set.
What the run starts from (tokenizer, model, learning rate) is built in `build`; its record, results.json, in `record`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import TrainerState, set_seed

from ..analysis.viewer import write_run_viewer
from ..bench.memory import keep_freed_memory
from ..data import load_corpus, make_collator, tokenize_split
from ..errors import HfAttnInputError, HfAttnPreempted
from ..generation import decoding_settings, translate_texts
from ..io_utils import ensure_writable_dir, write_json
from ..rundir import check_model_files, load_model_dir, read_run_args, run_pairs
from .bleu_curve import ValidationBleuCallback, fixed_subset
from .build import apply_noam, build_model, check_noam, run_tokenizer
from .cards import trainable_parameters, write_model_card
from .checkpoints import RunLock, average_last_checkpoints, newest_complete_checkpoint
from .hub import push_model_dir
from .metrics import Seq2SeqMetrics, score_translations
from .record import TrainedRun, evaluation_warnings, results_record, summary_line
from .reference import reference_for
from .trainer import HfAttnSeq2SeqTrainer, StopOnSignalCallback, TimeBudgetCallback
from .validate import check_cache_dir, check_model_flags, check_train_flags

logger = logging.getLogger("hf_attn")


def say(msg: str) -> None:
    """A progress line, from the main process only when several are launched (accelerate/torchrun)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"[hf-attn] {msg}", flush=True)


def _last_checkpoint(output_dir: Path) -> str | None:
    return newest_complete_checkpoint(output_dir)[0]


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


def preempted_message(signal_name: str, step: int, checkpoint: str | None) -> str:
    """The line `hf-attn train` ends with when a signal stopped it: the checkpoint and the command that resumes."""
    argv = sys.argv[1:]
    if argv[:1] == ["train"] and "--resume" not in argv:
        again = f"`{shlex.join(['hf-attn', *argv, '--resume'])}`"
    else:  # already a --resume, or a run of `hf-attn reproduce`
        again = "the same command"
    return (f"stopped by {signal_name} at step {step}, checkpoint saved: {checkpoint}; resume with {again}"
            if checkpoint else f"stopped by {signal_name} at step {step} before any checkpoint was saved")


def _finish(c: TrainedRun) -> dict:
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
    dec_seconds = time.time() - t_dec
    scores = score_translations(hyps, ref_test)
    (out_dir / "test_translations.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    run = results_record(c, model, src_test, hyps, scores, dec_seconds)
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


def bleu_curve_callback(hargs, corpus, tokenizer, last) -> list:
    """[`ValidationBleuCallback`] with ``--eval_bleu_every N`` (continuing a resumed checkpoint's curve; from step 0
    for a warm-started model), else []."""
    if not hargs.eval_bleu_every:
        return []
    src, ref = fixed_subset(*corpus.pairs("validation"), hargs.eval_bleu_sentences)
    return [ValidationBleuCallback(tokenizer, src, ref, hargs.eval_bleu_every, hargs.eval_bleu_beams,
                                   hargs.max_source_length, resume_from=last if hargs.resume else None,
                                   at_start=bool(hargs.init_from))]


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

    tokenizer, tokenizer_info = run_tokenizer(hargs, targs, out_dir, corpus, base)

    model, base, embedding_init_std = build_model(hargs, targs, last, overrides, tokenizer, base)
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
    callbacks = [*(extra_callbacks or []), *bleu_curve_callback(hargs, corpus, tokenizer, last)]
    trainer, budget = _make_trainer(hargs, targs, model, tokenizer, train_ds, eval_ds, last, callbacks)
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
        release_process_group()  # before exiting while the main process still scores and writes the run
        return None
    try:
        return _finish(TrainedRun(
            trainer=trainer, tokenizer=tokenizer, corpus=corpus, hargs=hargs, targs=targs, out_dir=out_dir, base=base,
            overrides=overrides, n_params=n_params, train_ds=train_ds, eval_ds=eval_ds, val=val, loss_hist=loss_hist,
            budget=budget, plan=plan, train_seconds=train_seconds, tokens=tokens, tokenizer_info=tokenizer_info,
            embedding_init_std=embedding_init_std, t_start=t_start, push_after=push_after, kept_memory=kept_memory,
            averaged=averaged))
    finally:
        release_process_group()


def release_process_group() -> None:
    """Leave the torch.distributed group of an `accelerate launch` / torchrun run, if any. A process that exits with
    its group alive can abort in the group's threads ("terminate called without an active exception", exit -6)
    while another process still works: the non-main processes leave as soon as the model is saved, the main one
    after writing the run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _finished_checkpoint(ckpt, max_steps: int) -> bool:
    """True when checkpoint ``ckpt`` already holds ``max_steps`` optimizer steps (so resuming it trains no more)."""
    state = Path(ckpt) / "trainer_state.json"
    if max_steps <= 0 or not state.is_file():
        return False
    return int(json.loads(state.read_text()).get("global_step", 0)) >= max_steps


# -------------------------------------------------------------------------------------------------- re-scoring
def evaluate_dir(model_dir: str, split: str = "test", test_file: str | None = None, source=None, target=None,
                 num_beams: int | None = None, length_penalty: float | None = None, batch_size: int = 32,
                 max_samples: int | None = None, write: bool = True) -> dict:
    """Re-score a saved model on its run's split (Bible/files/dataset from run_args.json) or on a file."""
    d = check_model_files(model_dir)
    # the data first: a bad --test_file/--source is one line before the model loads (and prints its progress)
    src, ref, what, prev = run_pairs(model_dir, split, test_file, source, target, max_samples)
    model, tokenizer = load_model_dir(model_dir)
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
