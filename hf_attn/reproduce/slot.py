"""``hf-attn reproduce --converged FILE [--deadline SECONDS]``: the converged matrix (`plans/converged.py`) in sittings
that each fit one slot of machine time.

A sitting runs the pilot (its runs without a record), decides the budget by the pre-registered rule once every
pilot seed is recorded, then runs the matrix at that budget, ``jobs`` at a time. With ``--deadline`` a run starts
only if its estimated duration (`Estimator`: the speed of recorded runs on this device kind) ends inside the
sitting, since a run cannot span two sittings on fresh machines; the rest waits for the next sitting, which skips
every recorded run. Every run of the group trains on one device kind: a sitting on another kind stops with one line.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import HfAttnInputError
from ..plans.converged import converged_budget, load_converged, matrix_budget, matrix_specs, pilot_specs
from ..plans.matrix import RunSpec
from ..report.records import load_records
from ..report.seeds import group_key
from .run_extras import device_kind

# seconds a run spends outside the Trainer's timed loop beyond what its results.json counts: the child's start-up,
# the attention-path probe, the checkpoint-averaging arm's test decoding and the analysis
EXTRA_SECONDS = 60.0


class Estimator:
    """Seconds a run will take, from the complete records made on ``kind``: its own group's runs of the preset
    first, then the preset's runs at any budget, then the slowest preset's; steps / (steps per second) plus the
    records' median time outside training and `EXTRA_SECONDS`. A GPU kind without records of its own is estimated
    from the other GPUs' records; without any: 0 (no estimate)."""

    def __init__(self, records: list[dict], kind: str):
        timed = [r for r in records if r["status"] == "complete" and (r["results"].get("train_seconds_this_run") or 0) > 0]
        self.runs = [r for r in timed if str(r["results"].get("device", "")).startswith(kind)]
        if not self.runs and kind.startswith("NVIDIA"):
            self.runs = [r for r in timed if str(r["results"].get("device", "")).startswith("NVIDIA")]

    @staticmethod
    def _rate(runs: list[dict]) -> float | None:
        rates = [r["results"]["train_steps"] / r["results"]["train_seconds_this_run"] for r in runs]
        return statistics.median(rates) if rates else None

    def rate(self, spec: RunSpec) -> float | None:
        own = [r for r in self.runs if r["spec"]["preset"] == spec.preset]
        same = [r for r in own if group_key(r["spec"]) == group_key(asdict(spec))]
        slowest = min((self._rate([r]) for r in self.runs), default=None)
        return self._rate(same) or self._rate(own) or slowest

    def __call__(self, spec: RunSpec) -> float:
        rate = self.rate(spec)
        if rate is None:
            return 0.0
        outside = statistics.median(r["results"]["total_seconds"] - r["results"]["train_seconds_this_run"]
                                    for r in self.runs)
        return spec.steps / rate + outside + EXTRA_SECONDS


def check_device_kind(names: set[str], records: list[dict], kind: str) -> None:
    """The group's runs so far (``names``) were trained on ``kind``; else one line naming both."""
    other = sorted({str(r["results"].get("device")) for r in records if r["name"] in names and r.get("results")
                    and not str(r["results"].get("device")).startswith(kind)})
    if other:
        raise HfAttnInputError(f"the converged matrix's records were trained on {', '.join(other)} and this machine is "
                               f"{kind}: every run of the group trains on one device kind; run this sitting on that "
                               "kind of machine")


def budget_line(decided: dict | None, budget: int | None) -> str:
    if budget is None:
        return "budget: not decided yet (the pilot is not recorded for every seed); run the same command again"
    if decided is None:
        return f"budget: {budget:,} steps (fixed by the matrix's records)"
    per_seed = ", ".join(f"seed {s} {'not converged within the pilot' if v is None else f'at {v:,}'}"
                         for s, v in decided["per_seed"].items())
    rule = f"the rule gives {decided['rule_steps']:,} steps ({decided['rule_epochs']} epochs; {per_seed})"
    if decided["capped"]:
        return f"budget: {budget:,} steps ({decided['epochs']} epochs), the slot's cap; {rule}"
    return f"budget: {budget:,} steps ({decided['epochs']} epochs of the training split): {rule}"


def run_converged(run_matrix, path: str | Path, runs_dir: Path, output_dir: Path, jobs: int, threads: int | None,
                  sentences: int, seconds: float | None = None, plan=None) -> list[str]:
    """One sitting of the converged matrix (module docstring) with ``run_matrix`` (`runner.run_matrix`); returns the
    names of the runs that failed. ``plan(specs)`` is called with each phase's runs before they start."""
    deadline = time.monotonic() + seconds if seconds else None
    cfg = load_converged(path)
    records = load_records(output_dir)
    kind = device_kind()
    pilot = pilot_specs(cfg)
    check_device_kind({s.name for s in pilot}, records, kind)
    estimate = Estimator(records, kind)
    print(f"[hf-attn] converged matrix ({path}) on {kind}: the pilot", flush=True)
    if plan:
        plan(pilot)
    failed = run_matrix(pilot, runs_dir, output_dir, jobs, threads, sentences, 0, deadline, estimate)
    records = load_records(output_dir)
    budget = matrix_budget(cfg, records)
    print(f"[hf-attn] {budget_line(converged_budget(cfg, records), budget)}", flush=True)
    if budget is None:
        return failed
    specs = matrix_specs(cfg, budget)
    check_device_kind({s.name for s in specs}, records, kind)
    if plan:
        plan(specs)
    estimate = Estimator(records, kind)
    return failed + run_matrix(specs, runs_dir, output_dir, jobs, threads, sentences,
                               cfg["matrix"].get("average_last", 0), deadline, estimate)
