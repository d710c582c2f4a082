"""The `softmax` reference printed beside a run's score, taken from the reproduction records (`results/runs/*.json`,
written by `hf-attn reproduce`; never typed by hand).

A record is a reference for a run when it is a complete `softmax` run on the same data (corpus and translation
codes, same test set size), with the same step budget, default model size, training setup (learning rate,
warm-up, batch, accumulation, label smoothing, processes, embedding init) and architecture (every recorded
`model_config` field, so the recipe too). A record with the run's own seed is preferred. A wall-clock budget, a
resized model or a warm start gets none. Installs without the repository's `results/` have no references.
"""

from __future__ import annotations

import json
from pathlib import Path

RECORD_DIRS = [Path(__file__).resolve().parents[2] / "results" / "runs"]
TRAINING_KEYS = ("learning_rate", "warmup_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "label_smoothing_factor", "world_size", "embedding_init_std")


def _records():
    for d in RECORD_DIRS:
        for path in sorted(Path(d).glob("*.json")) if Path(d).is_dir() else ():
            try:
                rec = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if rec.get("status") == "complete" and (rec.get("results") or {}).get("preset") == "softmax":
                yield rec


def _matches(run: dict, ref: dict) -> bool:
    data, rdata = run.get("data") or {}, ref.get("data") or {}
    if any(data.get(k) != rdata.get(k) for k in ("corpus", "source_code", "target_code", "name")):
        return False
    if (run.get("train_steps"), run.get("test_sentences")) != (ref.get("train_steps"), ref.get("test_sentences")):
        return False
    if not ref.get("default_model_size") or ref.get("minutes"):
        return False
    tr, rtr = run.get("training") or {}, ref.get("training") or {}
    if any(tr.get(k) != rtr.get(k) for k in TRAINING_KEYS):
        return False
    return (run.get("model_config") or {}) == (ref.get("model_config") or {})


def reference_for(run: dict) -> dict | None:
    """``{"bleu", "chrf", "steps", "device", "seed", "record"}`` of the matching softmax record, or None."""
    if run.get("minutes") or not run.get("default_model_size") or run.get("init_from"):
        return None
    found = [rec for rec in _records() if _matches(run, rec["results"])]
    if not found:
        return None
    seed = (run.get("training") or {}).get("seed")
    rec = next((r for r in found if r["results"]["training"].get("seed") == seed), found[0])
    res = rec["results"]
    return {"bleu": res["bleu"], "chrf": res["chrf"], "steps": res["train_steps"], "device": res.get("device"),
            "seed": res["training"].get("seed"), "record": rec["name"]}
