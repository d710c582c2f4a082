"""Relabel the run records of presets whose defaults changed, with the values their runs actually used.

The recipe-sensitivity experiments (results/REPORT.md) changed two defaults that the papers leave open:
``reluformer_reg_weight`` 1.0 -> 0.05 and ``gmm_gate_init`` 0.5 -> 0.1. A record trained before the change, with no
flag for the value, would otherwise read as a run of the new default. This script adds the old value as an explicit
`hf-attn train` flag to each such record's spec (so the record moves to the setup of that flag, where the report
names it) and notes the relabelling in the record. It rewrites ``results/runs`` and the names in
``results/plan.json``; running it twice changes nothing.

    python scripts/relabel_changed_defaults.py [--output_dir results]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hf_attn import PRESETS, HfAttnMarianConfig
from hf_attn.plans.matrix import RunSpec


def _uses(config, variant: str) -> bool:
    return any(variant in layers for layers in config.attention_layout().values())


# hyperparameter -> (flag value the earlier runs used, whether a preset's config uses it)
CHANGED = {
    "reluformer_reg_weight": ("1.0", lambda c: _uses(c, "reluformer")),
    "gmm_gate_init": ("0.5", lambda c: _uses(c, "gmm") and c.gmm_fusion == "gate"),
}


def old_flags(spec: dict) -> list[str]:
    """The flags giving a record's run the values it used where a default changed since (none if it set them)."""
    config = HfAttnMarianConfig.from_preset(spec["preset"])
    given = set(spec.get("train_args") or ())
    flags = []
    for name, (value, used) in CHANGED.items():
        if used(config) and f"--{name}" not in given and name not in PRESETS[spec["preset"]].overrides:
            flags += [f"--{name}", value]
    return flags


def relabel(output_dir: Path) -> list[tuple[str, str]]:
    """Rename and rewrite the affected records (JSON and translations); returns (old name, new name) pairs."""
    moved = []
    for path in sorted((output_dir / "runs").glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        extra = old_flags(rec["spec"])
        if not extra:
            continue
        spec = dict(rec["spec"], train_args=tuple(rec["spec"].get("train_args") or ()) + tuple(extra))
        new = RunSpec(**spec)
        rec.update(name=new.name, setup=new.setup, spec=dict(rec["spec"], train_args=list(spec["train_args"])),
                   relabelled={"from": rec["name"], "flags": extra,
                               "why": "trained before these defaults changed; the flags give the values it used"})
        target = path.with_name(f"{new.name}.json")
        target.write_text(json.dumps(rec, indent=1, ensure_ascii=False), encoding="utf-8")
        hyp = path.with_suffix(".hyp.txt")
        if hyp.is_file():
            hyp.rename(target.with_suffix(".hyp.txt"))
        path.unlink()
        moved.append((path.stem, new.name))
    plan = output_dir / "plan.json"
    if moved and plan.is_file():  # the planned runs keep their place under the new names
        names = dict(moved)
        plan.write_text(json.dumps([names.get(n, n) for n in json.loads(plan.read_text())], indent=1) + "\n")
    return moved


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output_dir", default="results")
    for old, new in relabel(Path(ap.parse_args().output_dir)):
        print(f"{old} -> {new}")
