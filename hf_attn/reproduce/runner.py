"""``hf-attn reproduce``: train a matrix of (preset, language pair, seed) runs with one recipe and budget, then write
a report (`hf_attn/report/report.py`) from their records.

    hf-attn reproduce --presets softmax,rela-g --pairs de-en --steps 600 --seeds 42 --output_dir results \\
        [--runs_dir runs/reproduce] [--jobs 2 --threads 1] [--report_only] [-- any `hf-attn train` flag]

Each run trains with `hf-attn train` in a child process (``--threads`` torch threads) into ``runs_dir/<name>``
(checkpoints every 100 steps), then is analysed: the "uses the source?" probe on the validation split, attention
statistics per site on the test split, and the variant's own figures (GMM gate per layer, calibration masks). The
record ``output_dir/runs/<name>.json`` (with the test translations beside it) is what the report reads, so the
report can be rebuilt without the model directories, and a matrix can span many sittings: a run with a record is
skipped, a run with a checkpoint is resumed, anything else starts. A run that diverges is recorded as failed (the
papers' "does not converge" rows) and not tried again; delete its record to retry.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..analysis.calibration import calibration_maps, calibration_modules
from ..analysis.gmm import gate_values, gmm_modules, mean_gate_per_layer
from ..analysis.probe import source_probe
from ..analysis.stats import attention_report, top_p_mass
from ..cli.train_args import parse_train_args
from ..data.bible import check_bible_pair
from ..errors import PREEMPTED_EXIT, HfAttnBusy, HfAttnInputError, HfAttnPreempted
from ..io_utils import check_creatable_dir, dumps_strict
from ..plans.converged import converged_specs
from ..plans.matrix import AVERAGED_HYPS, RunSpec, csv_values, experiment_specs, matrix, record_path
from ..plans.retrofit import STEP0_HYPS, load_retrofit, parent_ready, retrofit_specs
from ..report.experiments import check_experiments
from ..report.records import load_records
from ..report.report import check_report_targets, write_report
from ..rundir import load_model_dir, run_pairs
from ..training.checkpoints import RunLock, newest_complete_checkpoint
from ..training.run import train
from ..training.trainer import FirstSignal
from ..training.validate import check_model_flags, check_train_flags
from .run_extras import averaged_arm, run_attention_path, step_zero
from .slot import run_converged

RECORD_VERSION = 1
BUSY_EXIT = 73  # a child found its run directory locked by another matrix's run: that run is not trained twice
POLL_SECONDS = 0.2  # how often the matrix looks at its children (and at a signal to pass on): a finished run's slot
# is taken again, and a scheduler's signal reaches the runs, within this time


# -------------------------------------------------------------------------------------------------- one run
def _complete_checkpoint(run_dir: Path) -> bool:
    return newest_complete_checkpoint(run_dir)[0] is not None


def check_train_args(specs: list[RunSpec], runs_dir: Path) -> None:
    """The `hf-attn train` flags of the matrix (and those after --), checked before any run starts."""
    for spec in specs:
        hargs, targs, overrides, _ = parse_train_args(spec.train_argv(Path(runs_dir) / spec.name, False))
        check_train_flags(hargs, targs)
        check_model_flags(hargs, overrides, resume=False)
        if not (hargs.train_file or hargs.dataset):  # the Bible: --pairs xx-en or de-de, before any run starts
            try:
                check_bible_pair(hargs.source, hargs.target)
            except HfAttnInputError as e:
                raise HfAttnInputError(f"--pairs {spec.source}-{spec.target}: {e}") from None


def run_one(spec: RunSpec, runs_dir: Path, output_dir: Path, sentences: int = 200, average_last: int = 0) -> dict:
    """Train (or resume, or reuse) one run and write its record; returns the record. The record names the attention
    path the run took (`run_extras.attention_path`); with ``average_last`` N it also holds the checkpoint-averaging
    arm (``averaged``: the test split scored with the average of the last N checkpoints, translations beside it)."""
    run_dir = Path(runs_dir) / spec.name
    results = run_dir / "results.json"
    record = {"version": RECORD_VERSION, "name": spec.name, "setup": spec.setup, "spec": asdict(spec),
              "command": "hf-attn train " + " ".join(spec.train_argv(run_dir, False))}
    step0_hyps = None
    if spec.parent:  # a retrofit child: its parent swapped and scored before any update (`run_extras.step_zero`)
        step0, step0_hyps = step_zero(spec, runs_dir)
        record["retrofit"] = {"parent": spec.parent, "step0": step0}
    if not results.is_file():
        hargs, targs, overrides, given = parse_train_args(spec.train_argv(run_dir, _complete_checkpoint(run_dir)))
        try:
            train(hargs, targs, overrides, given)
        except HfAttnInputError as e:
            if "diverged" not in str(e):
                raise
            record.update(status="failed", error=" ".join(str(e).split()))
            return _write_record(output_dir, spec, record, None)
    run = json.loads(results.read_text(encoding="utf-8"))
    record.update(status="complete", results=run, attention_path=run_attention_path(run_dir))
    averaged_hyps = None
    if average_last > 1:
        record["averaged"], averaged_hyps = averaged_arm(run_dir, average_last)
    record["analysis"] = analyse_run(run_dir, sentences)
    hyps = (run_dir / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    if step0_hyps is not None:
        record_path(output_dir, spec).parent.mkdir(parents=True, exist_ok=True)
        record_path(output_dir, spec).with_suffix(STEP0_HYPS).write_text("\n".join(step0_hyps) + "\n", encoding="utf-8")
    return _write_record(output_dir, spec, record, hyps, averaged_hyps)


def _write_record(output_dir: Path, spec: RunSpec, record: dict, hyps: list[str] | None,
                  averaged_hyps: list[str] | None = None) -> dict:
    path = record_path(output_dir, spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    if hyps is not None:
        path.with_suffix(".hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    if averaged_hyps is not None:  # the checkpoint-averaging arm's test translations
        path.with_suffix(AVERAGED_HYPS).write_text("\n".join(averaged_hyps) + "\n", encoding="utf-8")
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(dumps_strict(record, indent=1, default=str), encoding="utf-8")  # NaN -> null, never a crash
    tmp.replace(path)  # a record is all there or not there
    return record


def analyse_run(run_dir: Path, sentences: int = 200) -> dict:
    """Probe, attention statistics and the variant's own figures, on the first ``sentences`` pairs."""
    model, tokenizer = load_model_dir(str(run_dir))
    model.eval()
    val_src, val_ref, _, _ = run_pairs(str(run_dir), "validation", max_samples=sentences)
    test_src, test_ref, _, _ = run_pairs(str(run_dir), "test", max_samples=sentences)
    val_src, val_ref, test_src, test_ref = val_src[:sentences], val_ref[:sentences], test_src[:sentences], test_ref[:sentences]
    out = {"probe": source_probe(model, tokenizer, val_src, val_ref),
           "attention": attention_report(model, tokenizer, test_src, test_ref)}
    out.update(variant_figures(model, tokenizer, test_src, test_ref))
    return out


def variant_figures(model, tokenizer, sources, references, batch_size: int = 16) -> dict:
    """GMM with the gate (gmm_fusion='gate'; the other fusions have none): mean gate per decoder layer (the
    mixture's share, Eq. 13). Calibration: the masks' mean, the share of
    source tokens a mask removes (m < 0.5) and the share of the importance 1 - m held by the top 10% of tokens."""
    batches = []
    for start in range(0, len(sources), batch_size):
        enc = tokenizer(sources[start : start + batch_size], text_target=references[start : start + batch_size],
                        padding=True, truncation=True, max_length=128, return_tensors="pt")
        enc["labels"] = enc["labels"].masked_fill(enc["labels"] == tokenizer.pad_token_id, -100)
        batches.append(enc)
    out = {}
    if gmm_modules(model) and model.config.gmm_fusion == "gate":
        gates = mean_gate_per_layer(gate_values(model, batches))
        out["gmm_gate"] = {str(k): round(v, 4) for k, v in gates.items()}
    if calibration_modules(model):
        sums: dict = {}
        for enc in batches:
            maps = calibration_maps(model, enc["input_ids"], enc["attention_mask"], labels=enc["labels"])
            src_real = enc["attention_mask"].bool()[:, None, None, :]
            tgt_real = enc["labels"].ne(-100)[:, None, :, None]
            keep = src_real & tgt_real
            for layer, m in maps.items():
                mask = m["mask"]
                k = keep.expand_as(mask)
                s = sums.setdefault(layer, [0.0, 0.0, 0.0, 0])
                s[0] += float(mask[k].mean()) * len(enc["input_ids"])
                s[1] += float((mask < 0.5)[k].float().mean()) * len(enc["input_ids"])
                s[2] += top_p_mass((1 - mask) * k, keep, 0.1) * len(enc["input_ids"])
                s[3] += len(enc["input_ids"])
        out["calibration_mask"] = {str(layer): {"mean_mask": round(a / n, 4), "removed_share": round(b / n, 4),
                                                "importance_top10_mass": round(c / n, 4)}
                                   for layer, (a, b, c, n) in sums.items()}
    return out


# -------------------------------------------------------------------------------------------------- the matrix
def child_env(threads: int | None) -> dict:
    """The environment of a child training process with ``threads`` torch threads (or torch's default)."""
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_ATTN_THREADS=str(threads))
    return env


def run_matrix(specs: list[RunSpec], runs_dir: Path, output_dir: Path, jobs: int = 1, threads: int | None = None,
               sentences: int = 200, average_last: int = 0, deadline: float | None = None,
               estimate=None) -> list[str]:
    """Run every spec without a record, ``jobs`` at a time, each in a child process; returns the failed names.
    With a ``deadline`` (a `time.monotonic` value) and ``estimate`` (spec -> seconds), a run starts only if its
    estimate ends before the deadline; the others are left for the next sitting (`run_extras`: ``average_last``).
    A retrofit child (``spec.parent``) starts once its parent is recorded (`retrofit.parent_ready`)."""
    todo = [s for s in specs if not record_path(output_dir, s).is_file()]
    print(f"[hf-attn] reproduce: {len(specs)} runs, {len(specs) - len(todo)} already recorded, {len(todo)} to run "
          f"({jobs} at a time)", flush=True)
    runs_dir.mkdir(parents=True, exist_ok=True)
    running: dict = {}
    failed: list[str] = []
    bar = tqdm(total=len(specs), initial=len(specs) - len(todo), desc="reproduce", unit="run")
    queue = list(todo)
    # a scheduler's signal to the matrix: remembered, then passed on to the running children, which save a
    # checkpoint and stop (`training.trainer.StopOnSignalCallback`)
    stop, forwarded, busy, left = FirstSignal().install(), False, [], []
    while queue or running:
        if stop.name and not forwarded:  # preempted: no new runs; the running ones save a checkpoint and stop
            tqdm.write(f"[hf-attn] {stop.name}: stopping {len(running)} run(s) at their next step; "
                       f"{len(queue)} not started")
            queue, forwarded = [], True
            for proc, _ in running.values():
                proc.send_signal(stop.signum)
        while len(running) < jobs:
            spec = _next_ready(queue, runs_dir, output_dir, failed, bar, not running)
            if spec is None:
                break
            if deadline is not None and time.monotonic() + (estimate(spec) if estimate else 0) > deadline:
                left.append(spec.name)
                bar.update(1)
                continue
            owner = RunLock(runs_dir / spec.name).holder()
            if owner is not None:  # another matrix trains it now: never twice
                busy.append(spec.name)
                tqdm.write(f"[hf-attn] {spec.name} is being trained by process {owner['pid']} on {owner['host']}: "
                           "skipped")
                bar.update(1)
                continue
            running[spec.name] = (_start(spec, runs_dir, output_dir, threads, sentences, average_last), spec)
        time.sleep(POLL_SECONDS)
        for name, (proc, spec) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[name]
            bar.update(1)
            _finished(name, proc.returncode, spec, runs_dir, output_dir, failed, busy)
    bar.close()
    stop.restore()
    _closing_lines(left, busy)
    if stop.name:
        raise HfAttnPreempted(f"stopped by {stop.name}: the runs in progress saved a checkpoint; run the same command "
                              "again to resume them and the rest of the matrix")
    return failed


def _next_ready(queue: list[RunSpec], runs_dir: Path, output_dir: Path, failed: list[str], bar, idle: bool):
    """Take the first run of ``queue`` that can start now (a retrofit child waits for its parent's record); a child
    whose parent failed is failed too. With nothing running (``idle``) and nothing ready, the waiting runs are
    dropped with one line each: their parents are not in this matrix and not recorded."""
    for spec in list(queue):
        state = parent_ready(spec, runs_dir, output_dir)
        if state == "ready":
            queue.remove(spec)
            return spec
        if state == "failed":
            queue.remove(spec)
            failed.append(spec.name)
            bar.update(1)
            tqdm.write(f"[hf-attn] {spec.name}: its parent {spec.parent} failed or its model is not in {runs_dir}; "
                       "not started")
    if idle:
        for spec in queue:
            tqdm.write(f"[hf-attn] {spec.name}: waits for its parent {spec.parent}, which is not recorded; run the "
                       "same command again once it is")
            bar.update(1)
        queue.clear()
    return None


def _start(spec: RunSpec, runs_dir: Path, output_dir: Path, threads, sentences: int, average_last: int):
    log = runs_dir / f"{spec.name}.log"
    state = "resuming" if _complete_checkpoint(runs_dir / spec.name) else "starting"
    tqdm.write(f"[hf-attn] {state} {spec.name} (log: {log})")
    cmd = [sys.executable, "-m", "hf_attn.reproduce.runner", json.dumps(asdict(spec)), str(runs_dir),
           str(output_dir), str(sentences), str(average_last)]
    with open(log, "a", encoding="utf-8") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=child_env(threads))


def _finished(name: str, code: int, spec: RunSpec, runs_dir: Path, output_dir: Path, failed: list, busy: list):
    if code == PREEMPTED_EXIT:
        tqdm.write(f"[hf-attn] {name} saved a checkpoint and stopped; it resumes from there")
    elif code == BUSY_EXIT:
        busy.append(name)
        tqdm.write(f"[hf-attn] {name} is being trained by another process: skipped")
    elif code != 0 or not record_path(output_dir, spec).is_file():
        failed.append(name)
        tqdm.write(f"[hf-attn] {name} stopped with exit code {code}; see {runs_dir / (name + '.log')}"
                   " (run the same command again to resume it)")
    else:
        rec = json.loads(record_path(output_dir, spec).read_text())
        r = rec.get("results") or {}
        tqdm.write(f"[hf-attn] {name}: " + (f"BLEU {r['bleu']:.1f} / chrF {r['chrf']:.1f}" if r else
                                             rec.get("error", rec["status"])))


def _closing_lines(left: list[str], busy: list[str]) -> None:
    if left:
        print(f"[hf-attn] deadline: {len(left)} run(s) not started, their estimated time would end past it "
              f"({', '.join(left)}); run the same command again (a fresh sitting) for them", flush=True)
    if busy:
        print(f"[hf-attn] {len(busy)} run(s) are being trained by another process ({', '.join(busy)}); run this "
              "command again once it is done to include their records", flush=True)


def report_lock(output_dir: Path):
    """An exclusive lock on ``output_dir/.report.lock`` (waits for another writer): reports never interleave."""
    @contextlib.contextmanager
    def held():
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(output_dir) / ".report.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    return held()


def remember_plan(output_dir: Path, specs: list[RunSpec]) -> None:
    """Add the matrix to ``output_dir/plan.json``: the report lists planned runs that have no record yet."""
    path = Path(output_dir) / "plan.json"
    plan = json.loads(path.read_text()) if path.is_file() else []
    new = [s.name for s in specs if s.name not in plan]
    if new or not path.is_file():  # unchanged: not rewritten (a slot's archive holds what changed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(plan + new, indent=1) + "\n")


@dataclass
class ReproduceOptions:
    """The options of `hf-attn reproduce` (its parser, `cli/reproduce.py`, takes its defaults from here): the matrix
    (comma-separated ``presets``, ``pairs``, ``steps`` and ``seeds`` on ``base``, or the cells of an ``experiments``
    file, ``only`` some of its experiments), where it goes (``output_dir``: records and report; ``runs_dir``: model
    directories), how it runs (``jobs`` at a time, ``threads`` torch threads each, ``sentences`` for the analysis)
    and the report (``bootstrap`` resamples; ``report_only``; also rewrite ``readme``'s headline and the paper pages
    under ``docs``). ``converged``: the pilot and matrix of a converged-matrix file (`slot.run_converged`), within
    ``deadline`` seconds; ``retrofit``: the parents and children of a retrofit file (`retrofit.py`);
    ``no_report``: train only."""

    presets: str = "softmax,rela-g"
    pairs: str = "de-en"
    steps: str = "600"
    seeds: str = "42"
    base: str = "marian"
    output_dir: str = "results"
    runs_dir: str = os.path.join("runs", "reproduce")
    jobs: int = 1
    threads: int | None = None
    sentences: int = 200
    bootstrap: int = 1000
    experiments: str | None = None
    only: str | None = None
    converged: str | None = None
    retrofit: str | None = None
    deadline: float | None = None
    report_only: bool = False
    no_report: bool = False
    readme: str | None = None
    docs: str | None = None


def matrix_of(options: ReproduceOptions, train_args: Sequence[str] = ()) -> list[RunSpec]:
    """The runs an `hf-attn reproduce` command line trains: its ``--experiments``, ``--retrofit`` or ``--converged``
    file's (the converged matrix's once its pilot has decided the budget), or its matrix's."""
    if options.converged:
        if train_args:
            raise HfAttnInputError("flags after -- with --converged: the file sets the flags of its runs")
        return converged_specs(options.converged, load_records(Path(options.output_dir)))
    if options.retrofit:
        if train_args:
            raise HfAttnInputError("flags after -- with --retrofit: the file sets the flags of its runs")
        return retrofit_specs(load_retrofit(options.retrofit))
    if options.experiments:
        if train_args:
            raise HfAttnInputError("flags after -- with --experiments: each experiment's arms set the flags of its runs")
        only = csv_values(options.only, "--only") if options.only else None
        return experiment_specs(Path(options.experiments), only, check=check_experiments)
    if options.only:  # else the whole matrix would run in its place
        raise HfAttnInputError(f"--only {options.only!r} picks experiments of an experiments file; give it with "
                               "--experiments FILE (e.g. results/experiments.json), or leave --only out")
    return matrix(csv_values(options.presets, "--presets"), csv_values(options.pairs, "--pairs"),
                  csv_values(options.steps, "--steps", int), csv_values(options.seeds, "--seeds", int),
                  options.base, list(train_args))


def reproduce(options: ReproduceOptions, train_args: Sequence[str], command: str) -> int:
    """`hf-attn reproduce`: train the matrix of ``options`` (``train_args`` go to every run) and write its report;
    ``command`` is the command line the report names."""
    train_args = list(train_args)
    for flag, v, lo in (("--jobs", options.jobs, 1), ("--sentences", options.sentences, 2),
                        ("--bootstrap", options.bootstrap, 100)):
        if v < lo:
            raise HfAttnInputError(f"{flag} {v}: need at least {lo}")
    if options.threads is not None and options.threads < 1:
        raise HfAttnInputError(f"--threads {options.threads}: need at least 1")
    for bad in ("--preset", "--source", "--target", "--max_steps", "--seed", "--output_dir", "--base", "--resume"):
        if any(t == bad or t.startswith(bad + "=") for t in train_args):
            raise HfAttnInputError(f"{bad} after --: the matrix sets it; use --presets/--pairs/--steps/--seeds/--base/"
                                   "--runs_dir of `hf-attn reproduce` instead")
    check_report_targets(options.no_report, options.report_only, options.readme, options.docs)
    output_dir = Path(options.output_dir)  # one line now, not a traceback after the runs; nothing made yet
    for flag, d in (("--output_dir", output_dir), ("--runs_dir", None if options.report_only else options.runs_dir)):
        if d is not None:
            check_creatable_dir(d, flag)
    failed = []
    if options.deadline is not None and not (math.isfinite(options.deadline) and options.deadline > 0):
        raise HfAttnInputError(f"--deadline {options.deadline}: give the seconds this sitting may run, more than 0")
    if options.deadline is not None and not options.converged:  # the plain matrix would run past it
        raise HfAttnInputError(f"--deadline {options.deadline:g} applies to a converged matrix only; give it with "
                               "--converged FILE, or leave it out")
    if options.converged and not options.report_only:
        if train_args:
            raise HfAttnInputError("flags after -- with --converged: the file sets the flags of its runs")

        def plan(specs):  # each phase (pilot, matrix) checked and planned before its runs start
            check_train_args(specs, Path(options.runs_dir))
            remember_plan(output_dir, specs)

        failed = run_converged(run_matrix, options.converged, Path(options.runs_dir), output_dir, options.jobs,
                               options.threads, options.sentences, options.deadline, plan)
    elif not options.report_only:
        specs = matrix_of(options, train_args)
        check_train_args(specs, Path(options.runs_dir))
        remember_plan(output_dir, specs)
        failed = run_matrix(specs, Path(options.runs_dir), output_dir, options.jobs, options.threads, options.sentences)
    if options.no_report:
        print("[hf-attn] no report (--no_report): rebuild it with `hf-attn reproduce --report_only`", flush=True)
        return _stopped(failed)
    readme = Path(options.readme) if options.readme else None
    docs = Path(options.docs) if options.docs else None
    with report_lock(output_dir):  # two matrices on one output_dir write their reports one after the other
        path = write_report(output_dir, options.bootstrap, command, readme, docs)
    print(f"[hf-attn] wrote {path}")
    return _stopped(failed)


def _stopped(failed: list[str]) -> int:
    if failed:
        raise HfAttnInputError(f"{len(failed)} run(s) stopped: {', '.join(failed)}; run the same command again to "
                               "resume them (their logs are in --runs_dir)")
    return 0


def _child(argv: list[str]) -> int:
    """`python -m hf_attn.reproduce.runner SPEC_JSON RUNS_DIR OUTPUT_DIR SENTENCES [AVERAGE_LAST]`: one run, in its
    own process."""
    spec_d, runs_dir, output_dir, sentences, *average_last = argv
    spec = json.loads(spec_d)
    spec["train_args"] = tuple(spec.get("train_args") or ())
    threads = os.environ.get("HF_ATTN_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    try:
        run_one(RunSpec(**spec), Path(runs_dir), Path(output_dir), int(sentences), int(average_last[0]) if average_last else 0)
    except HfAttnPreempted as e:
        print(f"[hf-attn] {' '.join(str(e).split())}", flush=True)
        return e.exit_code
    except HfAttnBusy as e:
        print(f"[hf-attn] {' '.join(str(e).split())}", flush=True)
        return BUSY_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
