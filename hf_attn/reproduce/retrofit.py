"""The retrofit matrix (``results/retrofit.json``, pre-registered): a trained softmax model (the *parent*) has its
attention swapped to a paper's preset (`swap_attention`, as ``hf-attn train --init_from`` does) and is fine-tuned;
the same parent fine-tuned as softmax is the control that separates "more training" from "the variant".

* `retrofit_specs`: the runs of ``hf-attn reproduce --retrofit FILE``: one parent per seed, then each parent's
  children (`RunSpec.parent` names the parent run; a child trains only once its parent is recorded).
* `step_zero`: a child's step 0, before its training starts: the parent swapped (seeded by the child's seed), saved
  as ``runs_dir/<child>.step0`` (the child trains from that directory, so step 0 is exactly its starting point) and
  its test split translated as the run's final test is (beam, length penalty, length limits).
* `load_retrofit` / `check_retrofit`: the file, with one error line for the first thing wrong in it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import HfAttnInputError
from ..modeling.hyperparameters import HfAttnConfigError
from .experiments import RULES
from .matrix import STEP0_SUFFIX, RunSpec, matrix

KEYS = ("pair", "base", "seeds", "parent", "children", "rules")
STEP0_FILE = "step0.json"  # in runs_dir/<child>.step0: the step-0 scores, written once
STEP0_HYPS = ".step0.hyp.txt"  # beside a child's record: the test translations of its step 0


def load_retrofit(path: str | Path) -> dict:
    """The pre-registration at ``path``, checked."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"--retrofit {str(path)!r}: cannot read it as JSON ({e})") from None
    check_retrofit(cfg, path)
    return cfg


def _flags(x) -> bool:
    return isinstance(x, list) and all(isinstance(f, str) for f in x)


def check_retrofit(cfg, path) -> None:
    """One error line for the first thing wrong in a retrofit file (the keys of ``results/retrofit.json``)."""
    def need(ok, what):
        if not ok:
            raise HfAttnInputError(f"--retrofit {str(path)!r}: {what}")

    need(isinstance(cfg, dict) and all(k in cfg for k in KEYS), f"needs the keys {', '.join(KEYS)}")
    need(isinstance(cfg["pair"], str) and cfg["pair"].count("-") == 1, '"pair" must be SOURCE-TARGET, e.g. de-en')
    need(isinstance(cfg["base"], str), '"base" must be a base model, e.g. marian')
    need(isinstance(cfg["seeds"], list) and cfg["seeds"] and all(type(s) is int for s in cfg["seeds"]),
         '"seeds" must be a list of integer seeds')
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


def step_zero(spec: RunSpec, runs_dir: Path) -> tuple[dict, list[str]]:
    """(scores, test translations) of a retrofit child at step 0: its parent (``runs_dir/<parent>``, trained)
    swapped to the child's preset with the child's seed, saved to `step_zero_dir` (the child trains from there)
    and translated as the child's final test will be. Done once: a later call reads what the first wrote."""
    import torch
    from transformers import set_seed

    from ..cli.train_args import parse_train_args
    from ..data import load_corpus
    from ..generation import translate_texts
    from ..rundir import load_model_dir
    from ..training.convert import convert_checkpoint
    from ..training.metrics import score_translations
    from .records import data_arguments
    from .run_extras import SCORE_KEYS

    out = step_zero_dir(spec, runs_dir)
    done = out / STEP0_FILE
    if done.is_file():
        saved = json.loads(done.read_text(encoding="utf-8"))
        return saved["scores"], saved["hypotheses"]
    parent = Path(runs_dir) / spec.parent
    if not (parent / "results.json").is_file():
        raise HfAttnInputError(f"{spec.name}: its parent {spec.parent} has no trained model in {parent}; train the "
                               "parent first (`hf-attn reproduce --retrofit` does)")
    if out.exists():  # a sitting stopped while writing it: start it again
        import shutil

        shutil.rmtree(out)
    argv = spec.train_argv(Path(runs_dir) / spec.name, False)
    hargs, targs, _, _ = parse_train_args(argv)
    set_seed(spec.seed)  # the swapped preset's own parameters start as the child's seed draws them
    convert_checkpoint(str(parent), str(out), spec.preset)
    model, tokenizer = load_model_dir(str(out))
    d = data_arguments(argv)
    corpus = load_corpus(d["corpus"], d["source"], d["target"], d["train_file"], d["validation_file"],
                         d["test_file"], d["dataset"], d["dataset_config_name"], {"test": d["max_predict_samples"]})
    sources, references = corpus.pairs("test")
    t0 = time.time()
    with torch.no_grad():
        hyps = translate_texts(model, tokenizer, sources, num_beams=hargs.num_beams,
                               length_penalty=hargs.length_penalty, batch_size=targs.per_device_eval_batch_size,
                               max_source_length=hargs.max_source_length,
                               max_new_tokens=hargs.generation_max_new_tokens, desc="step 0")
    scores = score_translations(hyps, references)
    scores = {**{k: scores[k] for k in SCORE_KEYS}, "decode_seconds": round(time.time() - t0, 1)}
    tmp = done.with_suffix(".tmp")
    tmp.write_text(json.dumps({"scores": scores, "hypotheses": hyps}, indent=1), encoding="utf-8")
    tmp.replace(done)
    return scores, hyps


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
