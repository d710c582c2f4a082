"""The retrofit in the report (``retrofit.json``, pre-registered; `plans/retrofit.py` defines its runs): what the
swap costs at step 0, how fine-tuning wins it back against the softmax control, and whether the retrofitted model
ends above the same preset trained from scratch for the same total number of updates.

`retrofit_section(output_dir, records, seed_cmp)` returns the Markdown lines and the data the report adds (None
without the file); `plot_retrofit` draws validation BLEU against fine-tuning step; `retrofit_sentence` says the
judged rules in one sentence (the README's Results), and `update_python_page` writes it, with the advice, into
docs/python.md's block."""

from __future__ import annotations

import copy
import shlex
from collections import defaultdict
from pathlib import Path

from ..errors import HfAttnInputError
from ..io_utils import replace_marked_block
from ..plans.retrofit import STEP0_HYPS, child_presets, load_retrofit, parent_specs, retrofit_specs
from .claim_checks import delta_ci
from .experiments import judge_rule, rules_table
from .plots import plot_bleu_curves
from .seeds import MIN_SEEDS, complete, mean_sd, seed_delta

RETROFIT_FILE = "retrofit.json"
PYTHON_PAGE = "python.md"  # docs/python.md: its "Converting" section holds the generated block
BLOCK_START, BLOCK_END = "<!-- retrofit-summary:start -->", "<!-- retrofit-summary:end -->"


def plot_retrofit(children: dict, control: str, path: Path, title: str) -> Path:
    """Validation BLEU against fine-tuning step, one line per preset of ``children`` ({preset: records}), the
    ``control`` dashed black (`plots.plot_bleu_curves`)."""
    series = [(f"{preset} (control)" if preset == control else preset, records,
               "dashed-reference" if preset == control else "")
              for preset, records in sorted(children.items(), key=lambda kv: (kv[0] != control, kv[0]))]
    return plot_bleu_curves(series, path, title, "fine-tuning step (0: the swapped parent before any update)")


def step0_record(record: dict, output_dir: Path) -> dict | None:
    """``record`` as its step 0 scored it (the swapped parent before any update), or None."""
    step0 = (record.get("retrofit") or {}).get("step0")
    hyps = Path(output_dir, "runs", f"{record['name']}{STEP0_HYPS}")
    if record.get("status") != "complete" or not step0 or not hyps.is_file():
        return None
    out = copy.deepcopy({k: v for k, v in record.items() if k != "hypotheses"})
    out["results"].update(bleu=step0["bleu"], chrf=step0["chrf"])
    out["hypotheses"] = hyps.read_text(encoding="utf-8").splitlines()
    return out


def retrofit_cells(cfg: dict, records: list[dict]) -> tuple[list[dict], dict, dict]:
    """(parents, {preset: children}, {preset: from-scratch runs at parent + child steps}), each by seed: the
    children are the file's runs by name; the from-scratch runs are the adopted recipe's (no extra flags) at the
    file's pair, base and seeds."""
    by_name = {r["name"]: r for r in records}
    parents = [by_name[s.name] for s in parent_specs(cfg) if s.name in by_name]
    children: dict = defaultdict(list)
    for spec in retrofit_specs(cfg):
        if spec.parent and spec.name in by_name:
            children[spec.preset].append(by_name[spec.name])
    source, target = cfg["pair"].split("-")
    total = cfg["parent"]["steps"] + cfg["children"]["steps"]
    scratch: dict = defaultdict(list)
    for r in records:
        s = r["spec"]
        if (s["source"], s["target"], s.get("base", "marian"), s["steps"]) == (source, target, cfg["base"], total) \
                and not s.get("train_args") and not s.get("parent") and s["seed"] in cfg["seeds"]:
            scratch[s["preset"]].append(r)
    for runs in (*children.values(), *scratch.values()):
        runs.sort(key=lambda r: r["spec"]["seed"])
    return sorted(parents, key=lambda r: r["spec"]["seed"]), dict(children), dict(scratch)


def _bleu(records: list[dict]) -> list[float]:
    return [r["results"]["bleu"] for r in complete(records)]


def _delta_text(result: dict | None, reason: str) -> str:
    return delta_ci(result["bleu"]) if result else reason


def _row(preset: str, kids: list[dict], zero: list[dict], parents: list[dict], control: list[dict] | None,
         scratch: list[dict], seed_cmp) -> tuple[str, dict]:
    """A preset's table row and data; ``control`` None for the control's own row."""
    drop, drop_reason = seed_delta(zero, parents, seed_cmp) if zero else (None, "not run yet")
    gap, gap_reason = seed_delta(kids, control, seed_cmp) if control is not None else (None, "(control)")
    vs, vs_reason = seed_delta(kids, scratch, seed_cmp)
    done = complete(kids)
    line = (f"| `{preset}` | {', '.join(str(r['spec']['seed']) for r in done) or 'not run yet'} | "
            f"{mean_sd(_bleu(zero))} | {_delta_text(drop, drop_reason)} | {mean_sd(_bleu(kids))} | "
            f"{mean_sd([r['results']['chrf'] for r in done])} | {_delta_text(gap, gap_reason)} | "
            f"{mean_sd(_bleu(scratch))} | {_delta_text(vs, vs_reason)} |")
    data = {"preset": preset, "seeds": [r["spec"]["seed"] for r in done], "step0_bleu": _bleu(zero),
            "bleu": _bleu(kids), "chrf": [r["results"]["chrf"] for r in done], "scratch_bleu": _bleu(scratch),
            "step0_vs_parent": drop["bleu"] if drop else None, "vs_control": gap["bleu"] if gap else None,
            "vs_scratch": vs["bleu"] if vs else None}
    return line, data


def _rules(cfg: dict, children: dict, scratch: dict, seed_cmp) -> list[dict]:
    """The file's rule templates, one per swapped preset ({preset}), judged on the seed-aware interval."""
    control = cfg["children"]["control"]
    cells = {f"{p}@child": children.get(p, []) for p in child_presets(cfg)}
    cells.update({f"{p}@scratch": scratch.get(p, []) for p in child_presets(cfg)})
    judged = []
    for preset in cfg["children"]["presets"]:
        if preset == control:
            continue
        for rule in cfg["rules"]:
            r = {k: v.replace("{preset}", preset) if isinstance(v, str) else v for k, v in rule.items()}
            judged.append({**judge_rule(r, cells, seed_cmp), "preset": preset})
    return judged


def _machines(parents: list[dict], children: dict, scratch: dict) -> str:
    def kinds(records):  # the machine kind: "NVIDIA H200 x1", "x86_64 CPU" (threads and processes left out)
        return sorted({str(r["results"].get("device")).split(",")[0] for r in complete(records)})

    kids = [r for rs in children.values() for r in rs]
    scratch_runs = [r for rs in scratch.values() for r in rs]
    return (f"Machines: parents and children on {', '.join(kinds(parents + kids)) or '-'}; the from-scratch runs on "
            f"{', '.join(kinds(scratch_runs)) or '-'} (where they differ, read \"beats scratch\" with the report's "
            "[Machine effect](#machine-effect): a change of machine moves BLEU about as much as a change of seed).")


def retrofit_section(output_dir: Path, records: list[dict], seed_cmp) -> tuple[list[str], dict] | None:
    """The report's "Retrofit" section: the figure, the table of the step-0 drop and the gaps at the end, the rules
    judged, and the file's advice (written after the runs); None without ``output_dir/retrofit.json``."""
    path = Path(output_dir, RETROFIT_FILE)
    if not path.is_file():
        return None
    cfg = load_retrofit(path)
    parents, children, scratch = retrofit_cells(cfg, records)
    control_name = cfg["children"]["control"]
    control = children.get(control_name, [])
    p, c = cfg["parent"], cfg["children"]
    total = p["steps"] + c["steps"]
    md = ['<a id="retrofit"></a>', "", "## Retrofit: a trained softmax model swapped and fine-tuned", "",
          f"From `{RETROFIT_FILE}`, committed before any of its runs. Parents: `{p['preset']}` trained from scratch "
          f"for {p['steps']:,} steps ({cfg['pair']}, {cfg['base']}, seeds {', '.join(map(str, cfg['seeds']))}; "
          f"test BLEU {mean_sd(_bleu(parents))}). Each parent is swapped to every preset below (`swap_attention`: "
          "every shared weight copied, the variant's own parameters initialised) and fine-tuned for "
          f"{c['steps']:,} steps with `{' '.join(c['train_args'])}`; `{control_name}`, the parent fine-tuned as it is, "
          "is the control. " + c.get("why", ""), "",
          f"Step 0 is the swapped model before any update, decoded as the final test translation. \"From scratch\" is "
          f"the same preset trained from scratch for {total:,} steps (parent + child) under the adopted recipe. Every "
          f"interval is the seed-aware 95% interval, given where both sides have {MIN_SEEDS} seeds.", ""]
    plot = plot_retrofit(children, control_name, Path(output_dir) / "plots" / "retrofit.png",
                         f"Retrofit: {cfg['pair']}, parents {p['preset']} {p['steps']:,} steps")
    md += [f"![retrofit]({plot.relative_to(output_dir)})", ""]
    md += [f"| preset | seeds | BLEU at step 0 | step 0 - parent [95% CI] | BLEU at {c['steps']} | chrF at "
           f"{c['steps']} | Δ vs control [95% CI] | from scratch, {total:,} steps | Δ vs scratch [95% CI] |",
           "|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for preset in child_presets(cfg):
        kids = children.get(preset, [])
        zero = [z for z in (step0_record(r, output_dir) for r in kids) if z]
        line, data = _row(preset, kids, zero, parents, None if preset == control_name else control,
                          scratch.get(preset, []), seed_cmp)
        md.append(line)
        rows.append(data)
    md += ["", _machines(parents, children, scratch), ""]
    rules = _rules(cfg, children, scratch, seed_cmp)
    md += rules_table(rules) + [""]
    advice = cfg.get("advice") or {}
    if advice:
        md += ["**What a practitioner should do** (written after the runs, from the rules above):", ""]
        md += [f"- **{paper}**: {text}" for paper, text in advice.items()] + [""]
    else:
        md += ["The advice per paper is written into the file once every run is recorded and the rules are judged.", ""]
    steps = {"parent": p["steps"], "child": c["steps"]}
    return md, {"parents": _bleu(parents), "rows": rows, "rules": rules, "advice": advice, "control": control_name,
                "steps": steps, "train_args": c["train_args"]}


def _ends(rules: list[dict], verdict: str, where: str) -> str | None:
    """"`a`, `b` and `c` end <where>" for the presets whose rule has ``verdict`` (None for none)."""
    names = [f"`{r['preset']}`" for r in rules if r["verdict"] == verdict]
    if not names:
        return None
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} end{'s' if len(names) == 1 else ''} {where}"


def retrofit_sentence(data: dict | None, link: str) -> str | None:
    """The judged rules in one sentence, linking ``link`` (the report's section); None until every rule is judged
    ("met" or "not met": each side with its seeds)."""
    if not data or not data.get("rules") or any(r["verdict"] not in ("met", "not met") for r in data["rules"]):
        return None
    control, steps = data["control"], data["steps"]
    vs_control = [r for r in data["rules"] if r["b"] == f"{control}@child"]
    vs_scratch = [r for r in data["rules"] if r["b"].endswith("@scratch")]
    scratch = f"above the same preset trained from scratch for {steps['parent'] + steps['child']:,} steps"
    parts = [_ends(vs_control, "met", f"level with the {control} control (the parent fine-tuned as {control}; the "
                                      "seed-aware interval reaches it) or above it"),
             _ends(vs_control, "not met", "below the control"),
             _ends(vs_scratch, "met", scratch) or f"none ends {scratch}"]
    parts = [p for p in parts if p]
    return (f"**Retrofit** ([the report's section]({link})): swapped from a {control} model trained for "
            f"{steps['parent']:,} steps and fine-tuned for {steps['child']:,} steps, {', '.join(parts[:-1])} and "
            f"{parts[-1]}.")


def update_python_page(docs_dir: Path, data: dict | None) -> Path | None:
    """Write `retrofit_sentence` and the file's advice per paper into docs/python.md's block (None, nothing written,
    without the retrofit's data); a page without the markers is an error."""
    if data is None:
        return None
    sentence = retrofit_sentence(data, "../results/REPORT.md#retrofit")
    body = [sentence or "The retrofit's rules are judged once every run is recorded ([the report's section]"
                        "(../results/REPORT.md#retrofit))."]
    if data["advice"]:
        body += ["", *(f"- **{paper}**: {text}" for paper, text in data["advice"].items())]
    command = shlex.join(["hf-attn", "train", "--init_from", "DIR", "--max_steps", str(data["steps"]["child"]),
                          *data["train_args"]])
    body += ["", f"The fine-tuning measured there, for a model DIR that `hf-attn convert` swapped: `{command}`."]
    path = Path(docs_dir) / PYTHON_PAGE
    if not path.is_file() or not replace_marked_block(path, BLOCK_START, BLOCK_END, "\n".join(["", *body, ""])):
        raise HfAttnInputError(f"{path}: no block between {BLOCK_START} and {BLOCK_END}; add the two marker lines "
                               "where the retrofit's advice belongs")
    return path
