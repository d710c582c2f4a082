"""The converged matrix (``results/converged.json``, pre-registered): a softmax pilot's validation-loss curves fix
one training budget by a stated rule, and the headline presets train at that budget.

* `converged_step`: the rule on one curve; `converged_budget`: the rule over the pilot's seeds, capped, with the
  budget in epochs of the training split (computed from the pilot's records, not typed).
* `converged_specs`: the runs of ``hf-attn reproduce --converged FILE``: the pilot, then (once every pilot seed is
  recorded) the matrix at the budget. A matrix record already made fixes the budget for the rest of the matrix.
* `load_converged` / `check_converged`: the file, with one error line for the first thing wrong in it.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import HfAttnInputError
from ..modeling.hyperparameters import HfAttnConfigError
from .files import check_common, checker, read_plan
from .matrix import RunSpec, matrix

KEYS = ("pair", "base", "seeds", "eval_every", "pilot", "rule", "matrix", "slot")


def load_converged(path: str | Path) -> dict:
    """The pre-registration at ``path``, checked."""
    cfg = read_plan(path, "--converged")
    check_converged(cfg, path)
    return cfg


def _positive_int(x) -> bool:
    return type(x) is int and x > 0


def check_converged(cfg, path) -> None:
    """One error line for the first thing wrong in a converged-matrix file (the keys of ``results/converged.json``)."""
    need = checker("--converged", path)
    check_common(cfg, need, KEYS)
    need(_positive_int(cfg["eval_every"]), '"eval_every" must be a positive integer (steps)')
    pilot, rule, mat, slot = cfg["pilot"], cfg["rule"], cfg["matrix"], cfg["slot"]
    need(isinstance(pilot, dict) and isinstance(pilot.get("preset"), str) and _positive_int(pilot.get("max_steps"))
         and pilot["max_steps"] % cfg["eval_every"] == 0,
         '"pilot" needs a "preset" and "max_steps", a multiple of "eval_every"')
    need(isinstance(rule, dict) and rule.get("metric") == "validation_loss" and _positive_int(rule.get("patience"))
         and isinstance(rule.get("min_delta"), (int, float)) and rule["min_delta"] >= 0
         and _positive_int(rule.get("budget_cap")) and rule["budget_cap"] % cfg["eval_every"] == 0,
         '"rule" needs metric "validation_loss", a positive integer "patience", "min_delta" >= 0 and "budget_cap", '
         'a multiple of "eval_every"')
    need(isinstance(mat, dict) and isinstance(mat.get("presets"), list) and mat["presets"]
         and type(mat.get("average_last", 0)) is int and mat.get("average_last", 0) >= 0,
         '"matrix" needs a list "presets" and an integer "average_last" >= 0')
    for part in (pilot, mat):
        need(isinstance(part.get("train_args", []), list) and all(isinstance(a, str) for a in part.get("train_args", [])),
             '"train_args" must be a list of `hf-attn train` flags')
    need(isinstance(slot, dict) and _positive_int(slot.get("jobs")) and _positive_int(slot.get("seconds")),
         '"slot" needs positive integers "jobs" and "seconds"')
    try:  # presets, pair and seeds checked as in a matrix
        matrix([pilot["preset"], *mat["presets"]], [cfg["pair"]], [1], cfg["seeds"], cfg["base"])
    except (HfAttnConfigError, HfAttnInputError) as e:
        raise HfAttnInputError(f"--converged {str(path)!r}: {e}") from None


# -------------------------------------------------------------------------------------------------- the rule
def converged_step(curve: list, min_delta: float, patience: int) -> int | None:
    """The step of the first evaluation after which none of the next ``patience`` evaluations of ``curve``
    ([[step, loss], ...]) lowers the best loss so far by more than ``min_delta``; None when the curve ends first
    (not converged within it)."""
    points = sorted((int(s), float(v)) for s, v in curve if v is not None and math.isfinite(v))
    best = math.inf
    for i, (step, value) in enumerate(points):
        best = min(best, value)
        after = points[i + 1 : i + 1 + patience]
        if len(after) == patience and all(v >= best - min_delta for _, v in after):
            return step
    return None


def pilot_specs(cfg: dict) -> list[RunSpec]:
    source, target = cfg["pair"].split("-")
    p = cfg["pilot"]
    return [RunSpec(p["preset"], source, target, p["max_steps"], seed, cfg["base"], tuple(p.get("train_args", ())))
            for seed in cfg["seeds"]]


def matrix_specs(cfg: dict, budget: int) -> list[RunSpec]:
    m = cfg["matrix"]
    return matrix(m["presets"], [cfg["pair"]], [budget], cfg["seeds"], cfg["base"], list(m.get("train_args", ())))


def _records_of(specs: list[RunSpec], records: list[dict]) -> list[dict]:
    names = {s.name for s in specs}
    return [r for r in records if r["name"] in names]


def epochs_of(steps: int, record: dict) -> float:
    """Epochs of the training split that ``steps`` optimizer steps take in ``record``'s run (its batch, accumulation
    and processes over the training pairs it kept after length filtering)."""
    res, tr = record["results"], record["results"]["training"]
    per_step = tr["per_device_train_batch_size"] * tr["gradient_accumulation_steps"] * max(1, tr["world_size"])
    return steps * per_step / res["sizes"]["train"]


def converged_budget(cfg: dict, records: list[dict]) -> dict | None:
    """The rule on the pilot's records: ``{"budget", "rule_steps", "capped", "per_seed", "epochs"}``, or None until
    every pilot seed has a complete record. ``per_seed`` maps a seed to its converged step (None: not within the
    pilot's ``max_steps``, counted as ``max_steps``)."""
    pilots = {r["spec"]["seed"]: r for r in _records_of(pilot_specs(cfg), records)}
    if len(pilots) < len(cfg["seeds"]) or any(r["status"] != "complete" for r in pilots.values()):
        return None
    rule, every, cap = cfg["rule"], cfg["eval_every"], cfg["pilot"]["max_steps"]
    per_seed = {seed: converged_step(r["results"]["curves"]["validation_loss"], rule["min_delta"], rule["patience"])
                for seed, r in sorted(pilots.items())}
    rule_steps = max(cap if s is None else s for s in per_seed.values())
    rule_steps = math.ceil(rule_steps / every) * every
    budget = min(rule_steps, rule["budget_cap"])
    return {"budget": budget, "rule_steps": rule_steps, "capped": budget < rule_steps, "per_seed": per_seed,
            "epochs": round(epochs_of(budget, next(iter(pilots.values()))), 2),
            "rule_epochs": round(epochs_of(rule_steps, next(iter(pilots.values()))), 2)}


def matrix_budget(cfg: dict, records: list[dict]) -> int | None:
    """The matrix's budget: the steps of its records once one exists (so later slots keep it), else the rule's."""
    m = cfg["matrix"]
    source, target = cfg["pair"].split("-")
    made = {r["spec"]["steps"] for r in records if r["spec"]["preset"] in m["presets"]
            and (r["spec"]["source"], r["spec"]["target"]) == (source, target) and r["spec"]["seed"] in cfg["seeds"]
            and list(r["spec"].get("train_args") or []) == list(m.get("train_args", []))}
    if len(made) > 1:
        raise HfAttnInputError(f"the converged matrix has records at {len(made)} budgets ({sorted(made)}); keep the "
                               "records of one budget in runs/")
    if made:
        return made.pop()
    decided = converged_budget(cfg, records)
    return decided["budget"] if decided else None


def converged_specs(path: str | Path, records: list[dict]) -> list[RunSpec]:
    """The runs of ``--converged FILE``: the pilot, plus the matrix once its budget is known."""
    cfg = load_converged(path)
    budget = matrix_budget(cfg, records)
    return pilot_specs(cfg) + (matrix_specs(cfg, budget) if budget else [])
