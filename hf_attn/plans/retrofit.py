"""The retrofit matrix (``results/retrofit.json``, pre-registered): a trained softmax model (the *parent*) has its
attention swapped to a paper's preset (`swap_attention`, as ``hf-attn train --init_from`` does) and is fine-tuned;
the same parent fine-tuned as softmax is the control that separates "more training" from "the variant".

* `retrofit_specs`: the runs of ``hf-attn reproduce --retrofit FILE``: one parent per seed, then each parent's
  children (`RunSpec.parent` names the parent run; a child trains only once its parent is recorded).
* A child's step 0 (`run_extras.step_zero`), before its training starts: the parent swapped (seeded by the child's
  seed), saved as `step_zero_dir` (the child trains from that directory, so step 0 is exactly its starting point)
  and its test split translated as the run's final test is (beam, length penalty, length limits).
* `load_retrofit` / `check_retrofit`: the file, with one error line for the first thing wrong in it.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HfAttnInputError
from ..modeling.hyperparameters import HfAttnConfigError
from .files import check_common, checker, read_plan
from .matrix import STEP0_SUFFIX, RunSpec, matrix
from .rules import RULES

KEYS = ("pair", "base", "seeds", "parent", "children", "rules")
STEP0_FILE = "step0.json"  # in runs_dir/<child>.step0: the step-0 scores, written once
STEP0_HYPS = ".step0.hyp.txt"  # beside a child's record: the test translations of its step 0


def load_retrofit(path: str | Path) -> dict:
    """The pre-registration at ``path``, checked."""
    cfg = read_plan(path, "--retrofit")
    check_retrofit(cfg, path)
    return cfg


def _flags(x) -> bool:
    return isinstance(x, list) and all(isinstance(f, str) for f in x)


def check_retrofit(cfg, path) -> None:
    """One error line for the first thing wrong in a retrofit file (the keys of ``results/retrofit.json``)."""
    need = checker("--retrofit", path)
    check_common(cfg, need, KEYS)
    need(isinstance(cfg["base"], str), '"base" must be a base model, e.g. marian')
    parent, children = cfg["parent"], cfg["children"]
    need(isinstance(parent, dict) and isinstance(parent.get("preset"), str) and type(parent.get("steps")) is int
         and parent["steps"] > 0 and _flags(parent.get("train_args", [])),
         '"parent" needs a "preset", a positive integer "steps" and a list of strings "train_args"')
    need(isinstance(children, dict) and isinstance(children.get("presets"), list) and children["presets"]
         and all(isinstance(p, str) for p in children["presets"]) and isinstance(children.get("control"), str)
         and type(children.get("steps")) is int and children["steps"] > 0 and _flags(children.get("train_args", [])),
         '"children" needs a list "presets", a "control" preset, a positive integer "steps" and a list of strings '
         '"train_args"')
    need(not any(f == "--init_from" or f.startswith("--init_from=") for f in children.get("train_args", [])),
         '"children": "train_args" must not give --init_from (each child starts from its parent, swapped)')
    for rule in cfg["rules"]:
        need(isinstance(rule, dict) and isinstance(rule.get("claim"), str) and rule.get("type") in RULES
             and all(isinstance(rule.get(k), str) and rule[k].count("@") == 1
                     and rule[k].split("@")[1] in ("child", "scratch") for k in ("a", "b"))
             and isinstance(rule.get("margin"), (int, float)) and not isinstance(rule["margin"], bool),
             f"rule {rule.get('claim') if isinstance(rule, dict) else rule!r} needs a claim, a type "
             f"({', '.join(RULES)}), cells a and b of the form PRESET@child or PRESET@scratch ({{preset}} for each "
             "child preset) and a numeric margin")
    advice = cfg.get("advice", {})  # written after the runs: {paper: what a practitioner should do}
    need(isinstance(advice, dict) and all(isinstance(k, str) and isinstance(v, str) and v for k, v in advice.items()),
         '"advice" must map each paper to a sentence of advice, e.g. {"ReLA": "..."}')
    presets = [parent["preset"], children["control"], *children["presets"]]
    try:  # presets, pair, steps and seeds checked as a matrix's
        matrix(presets, [cfg["pair"]], [parent["steps"], children["steps"]], cfg["seeds"], cfg["base"])
    except (HfAttnInputError, HfAttnConfigError) as e:
        need(False, str(e).replace("--presets: ", "").replace("--pairs: ", ""))


def child_presets(cfg: dict) -> list[str]:
    """The presets each parent is fine-tuned as: the control first, then the swapped presets."""
    return [cfg["children"]["control"]] + [p for p in cfg["children"]["presets"] if p != cfg["children"]["control"]]


def parent_specs(cfg: dict) -> list[RunSpec]:
    source, target = cfg["pair"].split("-")
    p = cfg["parent"]
    return [RunSpec(p["preset"], source, target, p["steps"], seed, cfg["base"], tuple(p.get("train_args", ())))
            for seed in cfg["seeds"]]


def retrofit_specs(cfg: dict) -> list[RunSpec]:
    """The parents (one per seed), then per parent its children, the control first: every child has its parent's
    seed and the file's children flags."""
    parents = parent_specs(cfg)
    c = cfg["children"]
    children = [RunSpec(preset, p.source, p.target, c["steps"], p.seed, p.base, tuple(c.get("train_args", ())),
                        parent=p.name) for p in parents for preset in child_presets(cfg)]
    return parents + children


def step_zero_dir(spec: RunSpec, runs_dir: Path) -> Path:
    return Path(runs_dir) / f"{spec.name}{STEP0_SUFFIX}"


def parent_ready(spec: RunSpec, runs_dir: Path, output_dir: Path) -> str | None:
    """For a child: "ready" once its parent's record is complete and its model is in ``runs_dir``, "failed" when the
    parent's record says it failed or its model is not here, None while the parent is still to come. Any other run
    is "ready"."""
    if not spec.parent:
        return "ready"
    path = Path(output_dir) / "runs" / f"{spec.parent}.json"  # `matrix.record_path` of the parent
    if not path.is_file():
        return None
    if json.loads(path.read_text(encoding="utf-8")).get("status") != "complete":
        return "failed"
    return "ready" if (Path(runs_dir) / spec.parent / "results.json").is_file() else "failed"
