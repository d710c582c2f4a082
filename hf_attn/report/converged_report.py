"""The converged matrix in the report: its budget (the pre-registered rule on the pilot), its Across-seeds group
for each arm (final weights; the average of the last checkpoints), and validation BLEU against step per preset.

`converged_section(output_dir, records, seed_cmp)` returns the Markdown lines and the data the report adds (None
when the file or its pilot is missing); `converged_curves` draws the figure on its own."""

from __future__ import annotations

import copy
from collections import defaultdict
from pathlib import Path

from ..plans.converged import converged_budget, load_converged, matrix_budget, matrix_specs, pilot_specs
from ..plans.matrix import AVERAGED_HYPS
from .plots import plot_bleu_curves
from .seeds import complete
from .tables import across_seeds_table

CONVERGED_FILE = "converged.json"


def converged_curves(runs: dict, path: Path, title: str, pilot: list[dict] | None = None) -> Path:
    """Validation BLEU against step, one line per preset of ``runs`` ({preset: records}); softmax in black, and the
    ``pilot``'s softmax (longer) dashed in grey (`plots.plot_bleu_curves`)."""
    series = [(preset, records, "reference" if preset == "softmax" else "")
              for preset, records in sorted(runs.items(), key=lambda kv: (kv[0] != "softmax", kv[0]))]
    if pilot:
        series.append(("softmax pilot", pilot, "dashed"))
    return plot_bleu_curves(series, path, title, "optimizer step")


def averaged_record(record: dict, output_dir: Path) -> dict | None:
    """``record`` as its checkpoint-averaging arm scored it (its ``averaged`` scores and translations), or None."""
    arm = record.get("averaged")
    hyps = Path(output_dir, "runs", record["name"] + AVERAGED_HYPS)
    if not arm or not hyps.is_file():
        return None
    out = copy.deepcopy({k: v for k, v in record.items() if k != "hypotheses"})
    out["name"] = record["name"] + "+avg"
    out["results"].update({k: arm[k] for k in ("bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_details")})
    out["hypotheses"] = hyps.read_text(encoding="utf-8").splitlines()
    return out


def _by_preset(records: list[dict]) -> dict:
    runs = defaultdict(list)
    for r in sorted(records, key=lambda r: r["spec"]["seed"]):
        runs[r["spec"]["preset"]].append(r)
    return runs


def budget_sentence(cfg: dict, decided: dict, budget: int) -> str:
    rule, cap = cfg["rule"], cfg["pilot"]["max_steps"]
    seeds = ", ".join(f"seed {s} {'not within ' + format(cap, ',') if v is None else 'at ' + format(v, ',')}"
                      for s, v in decided["per_seed"].items())
    text = (f"The budget comes from the pilot ({cfg['pilot']['preset']}, validation every {cfg['eval_every']:,} steps "
            f"up to {cap:,}) by the pre-registered rule (`converged.json`: the first evaluation after which the "
            f"validation loss did not improve by more than {rule['min_delta']:g} for {rule['patience']} evaluations): "
            f"{seeds}; the rule's budget, the largest over the seeds, is {decided['rule_steps']:,} steps "
            f"({decided['rule_epochs']} epochs of the training split).")
    if budget != decided["rule_steps"]:
        text += (f" The matrix trains {budget:,} steps ({decided['epochs']} epochs), the slot's cap: it shows the "
                 "methods at that budget, not converged by the rule.")
    return text


def converged_section(output_dir: Path, records: list[dict], seed_cmp) -> tuple[list[str], dict] | None:
    """The report's converged group: the budget, an Across-seeds table per arm, the BLEU-against-step figure."""
    path = Path(output_dir, CONVERGED_FILE)
    if not path.is_file():
        return None
    cfg = load_converged(path)
    decided, budget = converged_budget(cfg, records), matrix_budget(cfg, records)
    if decided is None or budget is None:
        return None
    names = {s.name for s in matrix_specs(cfg, budget)}
    final = [r for r in records if r["name"] in names]
    averaged = [a for a in (averaged_record(r, output_dir) for r in complete(final)) if a]
    pilot_names = {s.name for s in pilot_specs(cfg)}
    md = [f"## Across seeds: converged, {cfg['pair'].replace('-', '->')}, {budget:,} steps", "",
          budget_sentence(cfg, decided, budget), ""]
    data = {"budget": budget, "rule": decided, "arms": {}}
    n = cfg["matrix"].get("average_last", 0)
    for arm, runs in (("final weights", final), (f"average of the last {n} checkpoints", averaged)):
        if not runs:
            continue
        by_preset = _by_preset(runs)
        presets = [p for p in cfg["matrix"]["presets"] if p in by_preset]
        table, scores = across_seeds_table(by_preset, seed_cmp, presets)
        md += [f"### {arm.capitalize()}", ""] + table + [""]
        data["arms"][arm] = scores
    plot = converged_curves(_by_preset(final), Path(output_dir, "plots", "converged_bleu_curves.png"),
                            f"{cfg['pair']}, {budget:,} steps", [r for r in records if r["name"] in pilot_names])
    md += [f"![validation BLEU against step]({plot.relative_to(output_dir)})", ""]
    return md, data
