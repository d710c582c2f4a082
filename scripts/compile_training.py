"""Should `hf-attn reproduce` train compiled? End-to-end `hf-attn train` runs, eager against `--torch_compile`, in
the same session, interleaved and repeated.

Each round trains every preset twice from the same seed, once eagerly and once compiled (the order alternates
between rounds), each in a fresh process, and times the whole process: start-up, the first call's compilation,
training, evaluation and the test translation, which is what a run of the matrix costs. Per preset it gives the
median over rounds of t_eager / t_compiled (> 1 = compiling pays) and how far the compiled run's training losses
move from the eager run's (the largest relative difference over the logged steps). Compiling is worth it for a
preset when the losses agree within ``--tolerance`` and the median ratio is above 1 + ``--margin``:

    python scripts/compile_training.py --presets softmax,rela-g,gmm,reluformer,calibration-gate,ran-d \\
        --steps 300 --rounds 3 --output results/compile_training.json

``--side_by_side`` trains a round's eager and compiled run at the same time, each with ``--threads`` torch threads
(default 1): the conditions of `hf-attn reproduce --jobs 2 --threads 1`, and half the wall time. Both runs of a pair
share the machine, so the pair's ratio is fair between them; the run that finishes first leaves the other a quieter
machine for its last stretch, which pulls the ratio towards 1 (a conservative bias). Each run's record also gives
its training and decoding seconds, reported apart: compilation is in the training seconds (Trainer compiles the
training forward; the test translation generates eagerly).

Do not run it while anything else runs on the machine: the ratios are only as good as the quiet around them.
Flags after ``--`` go to every `hf-attn train` call (e.g. smaller models for a quick check). ``--docs`` writes the
results' table into the Speed page's block (no training):

    python scripts/compile_training.py --docs docs/speed.md --from results/compile/training_end_to_end.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

import torch

from hf_attn.bench.render import update_block
from hf_attn.io_utils import write_json
from hf_attn.reproduce.runner import child_env

DOCS_PAGE = "docs/speed.md"
MARKERS = ("<!-- compile-training:start -->", "<!-- compile-training:end -->")


@dataclass
class Running:
    """A started `hf-attn train` process; a thread waits for it and notes when it ended, so that a run which ends
    while the script is still waiting for its neighbour is timed to its own end."""

    proc: subprocess.Popen
    started: float
    ended: float | None = None
    err: str = ""
    waiter: threading.Thread | None = None


def start(preset: str, steps: int, out: Path, compiled: bool, backend: str, extra: list[str],
          threads: int | None) -> Running:
    """Start one `hf-attn train` process (``threads`` torch threads, or torch's default)."""
    cmd = [sys.executable, "-m", "hf_attn.cli", "train", "--preset", preset, "--max_steps", str(steps),
           "--output_dir", str(out), "--save_strategy", "no", "--disable_tqdm", "true", *extra]
    if compiled:
        cmd += ["--torch_compile", "true", "--torch_compile_backend", backend]
    run = Running(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   env=child_env(threads)),
                  time.perf_counter())

    def wait():
        run.err = run.proc.communicate()[1] or ""
        run.ended = time.perf_counter()

    run.waiter = threading.Thread(target=wait, daemon=True)
    run.waiter.start()
    return run


def finish(run: Running, preset: str, out: Path, compiled: bool) -> dict:
    """Wait for a run; its wall seconds, its record's training and decoding seconds, and its logged losses."""
    run.waiter.join()
    seconds = run.ended - run.started
    if run.proc.returncode != 0:
        tail = (run.err.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"compile_training: {preset} ({'compiled' if compiled else 'eager'}) failed: {tail}")
    record = json.loads((out / "results.json").read_text())
    if record["training"].get("torch_compile", False) != compiled:  # the record says how the run trained
        raise SystemExit(f"compile_training: {out}/results.json does not record torch_compile={compiled}")
    return {"seconds": seconds, "train": record["train_seconds_this_run"], "decode": record["decode_seconds"],
            "losses": record["curves"]["train_loss"]}


def loss_gap(eager: list, compiled: list) -> float:
    """The largest |compiled - eager| / |eager| over the steps both runs logged."""
    a, b = dict(eager), dict(compiled)
    common = sorted(set(a) & set(b))
    if not common:
        raise SystemExit("compile_training: the two runs logged no common step; lower --logging_steps")
    return max(abs(b[s] - a[s]) / max(abs(a[s]), 1e-12) for s in common)


def measure(presets: list[str], steps: int, rounds: int, backend: str, extra: list[str], work: Path,
            side_by_side: bool = False, threads: int | None = None) -> dict:
    """Per preset: the per-round times and ratios (whole process, training, decoding), their medians, and the
    largest loss gap."""
    kinds = ("seconds", "train", "decode")
    times = {p: {k: {"eager": [], "compiled": []} for k in kinds} for p in presets}
    gaps = {p: [] for p in presets}
    bar = tqdm(total=rounds * len(presets) * 2, desc="compile_training", unit="run")
    for r in range(rounds):
        for p in presets:
            order = (False, True) if r % 2 == 0 else (True, False)
            outs = {c: work / f"{p}-{'compiled' if c else 'eager'}-{r}" for c in order}
            runs = {}
            if side_by_side:
                started = {c: start(p, steps, outs[c], c, backend, extra, threads) for c in order}
                for c in order:
                    runs[c] = finish(started[c], p, outs[c], c)
                    bar.update()
            else:
                for c in order:
                    runs[c] = finish(start(p, steps, outs[c], c, backend, extra, threads), p, outs[c], c)
                    bar.update()
            for c, run in runs.items():
                for k in kinds:
                    times[p][k]["compiled" if c else "eager"].append(round(run[k], 2))
                shutil.rmtree(outs[c], ignore_errors=True)
            gaps[p].append(loss_gap(runs[False]["losses"], runs[True]["losses"]))
    bar.close()
    result = {}
    for p in presets:
        # the records give seconds to 0.1: a part under that (a tiny run's decoding) counts as 0.1 s on both sides
        ratios = {k: [max(e, 0.1) / max(c, 0.1) for e, c in zip(times[p][k]["eager"], times[p][k]["compiled"])]
                  for k in kinds}
        result[p] = {"seconds": times[p]["seconds"], "train_seconds": times[p]["train"],
                     "decode_seconds": times[p]["decode"], "ratios": [round(x, 3) for x in ratios["seconds"]],
                     "median_ratio": round(statistics.median(ratios["seconds"]), 3),
                     "median_train_ratio": round(statistics.median(ratios["train"]), 3),
                     "median_decode_ratio": round(statistics.median(ratios["decode"]), 3),
                     "loss_gap": max(gaps[p])}
    return result


def verdicts(result: dict, tolerance: float, margin: float) -> dict:
    """A preset may train compiled when its losses agree within ``tolerance`` and it is faster by ``margin``."""
    return {p: bool(r["loss_gap"] <= tolerance and r["median_ratio"] > 1 + margin) for p, r in result.items()}


def table(result: dict, ok: dict) -> list[str]:
    """The results as a markdown table, a row per preset."""
    lines = ["| preset | whole run, eager / compiled s (median) | t_eager / t_compiled: whole run | training | "
             "decoding | largest loss gap | compile |", "|---|---|---|---|---|---|---|"]
    for p, r in result.items():
        eager, compiled = (statistics.median(r["seconds"][k]) for k in ("eager", "compiled"))
        lines.append(f"| {p} | {eager:.0f} / {compiled:.0f} | {r['median_ratio']:.2f} | {r['median_train_ratio']:.2f} "
                     f"| {r['median_decode_ratio']:.2f} | {r['loss_gap']:.1e} | {'yes' if ok[p] else 'no'} |")
    return lines


def docs_block(sources: list[str]) -> str:
    """The Speed page's block: per results file its command, its settings and its table."""
    out = [f"Generated by `python scripts/compile_training.py --docs {DOCS_PAGE} --from {' '.join(sources)}` from:"]
    for source in sources:
        data = json.loads(Path(source).read_text())
        s = data["settings"]
        how = (f"side by side, {s['threads']} torch thread(s) each" if s.get("side_by_side")
               else f"one after the other, {s['threads'] or 'default'} torch threads")
        out += ["", "```bash", s["command"], "```", "",
                f"{s['steps']} training steps per run, {s['rounds']} interleaved rounds, eager and compiled {how}; "
                f"backend {s['backend']}; same losses = largest relative difference <= {s['tolerance']}, faster = "
                f"median ratio > 1 + {s['margin']}; torch {s['torch']}, {s['cpu_count']} CPUs"
                + (f"; extra `hf-attn train` flags: `{' '.join(s['extra'])}`" if s["extra"] else "") + ".", "",
                *table(data["presets"], data["compile"])]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python", "scripts/compile_training.py", *argv])
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="softmax,rela-g,gmm,reluformer,calibration-gate,ran-d")
    ap.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    ap.add_argument("--tolerance", type=float, default=0.01,
                    help="largest relative training-loss difference that counts as the same losses (default 0.01)")
    ap.add_argument("--margin", type=float, default=0.05, help="speed-up needed beyond noise (default 0.05)")
    ap.add_argument("--side_by_side", action="store_true",
                    help="train a round's eager and compiled run at the same time (as `hf-attn reproduce --jobs 2`)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads per run (default: torch's own; 1 with --side_by_side)")
    ap.add_argument("--output", help="the results JSON to write")
    ap.add_argument("--docs", nargs="?", const=DOCS_PAGE, default=None, metavar="PAGE",
                    help=f"write the table of --from's results into PAGE's block (default {DOCS_PAGE}); no training")
    ap.add_argument("--from", dest="sources", nargs="+", default=None, help="compile_training JSON files for --docs")
    a = ap.parse_args(argv)
    if (a.docs is None) != (a.sources is None):
        ap.error(f"--docs {DOCS_PAGE} and --from RESULT.json ... go together")
    if a.docs:
        for source in a.sources:
            if not Path(source).is_file():
                ap.error(f"--from {source}: no such file; give a JSON written by --output")
        update_block(Path(a.docs), MARKERS, docs_block(a.sources), "compile_training")
        return 0
    if not a.output:
        ap.error("--output RESULT.json is needed to measure (or --docs PAGE --from RESULT.json to render)")
    presets = [p for p in a.presets.split(",") if p]
    threads = a.threads if a.threads is not None else (1 if a.side_by_side else None)
    checks = (("--steps", a.steps, 1), ("--rounds", a.rounds, 1), ("--threads", 1 if threads is None else threads, 1))
    for name, value, low in checks:
        if value < low:
            ap.error(f"{name} {value}: must be at least {low}")
    with tempfile.TemporaryDirectory(prefix="hf-attn-compile-") as tmp:
        result = measure(presets, a.steps, a.rounds, a.backend, extra, Path(tmp), a.side_by_side, threads)
    ok = verdicts(result, a.tolerance, a.margin)
    settings = {"steps": a.steps, "rounds": a.rounds, "backend": a.backend, "tolerance": a.tolerance,
                "side_by_side": a.side_by_side, "threads": threads, "command": command,
                "margin": a.margin, "extra": extra, "torch": torch.__version__, "cpu_count": os.cpu_count()}
    write_json(a.output, {"settings": settings, "presets": result, "compile": ok})
    print("\n".join(table(result, ok)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
