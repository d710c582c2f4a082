"""The machine behind each run, and what changing it changes.

The same seed is not the same run on two kinds of machine: dropout's random streams differ between CPU and CUDA (and
the kernels round differently), so a run trained again on another kind of machine is another draw, like another
seed. A run's record names its machine (``results.device``). A second record of the same run (preset, pair, budget,
seed, base, flags) trained on another kind of machine lives in ``runs/machine/<name>.json``, with its test
translations beside it, under the same name as its first record in ``runs/``. A second record may be the record of
another setup whose flags give the same configuration (an experiment's arm that sets a value to what is now the
default): its ``same_run_as`` names that record, its flags, and why they are the same run.

`one_kind_per_group` picks the records the report's tables use: in a group (base, pair, budget, flags) whose first
records come from more than one kind of machine, the records of one kind wherever that kind has a record of every
run of the group (the CPU where it does); otherwise the first records, and the group's table says which machines
they come from (`machines_line`). `machine_effect_section` sets the BLEU difference of each run recorded on two
kinds of machine against the spread of its preset's BLEU across seeds.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

from ..errors import HfAttnInputError
from .seeds import group_key, group_records, group_title, sd

MACHINE_DIR = "machine"  # runs/machine/: second records, each of a run also recorded in runs/ on another kind
PREFERRED_KIND = "CPU"  # the kind a group's table uses when several kinds have a record of every run


def device(record: dict) -> str:
    """The machine a run trained on, as its record names it (``results.device``); failed runs have none."""
    return (record.get("results") or {}).get("device") or "unknown machine"


def device_kind(record: dict) -> str:
    """``CPU`` for any CPU setup (threads, processes and allocator aside), else the accelerator's name without its
    count (``NVIDIA H200 x1`` -> ``NVIDIA H200``)."""
    name = device(record)
    return "CPU" if "CPU" in name else re.sub(r" x\d+$", "", name)


def load_second_records(output_dir: Path) -> list[dict]:
    """The records of ``runs/machine/`` with their test translations, like `records.load_records`."""
    out = []
    for path in sorted(Path(output_dir, "runs", MACHINE_DIR).glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        if rec.get("name") != path.stem:
            raise HfAttnInputError(f"{path}: the record is named {rec.get('name')!r}; a second record keeps its run's "
                                   f"name as its file name ({rec.get('name')}.json)")
        hyp = path.with_suffix(".hyp.txt")
        rec["hypotheses"] = hyp.read_text(encoding="utf-8").splitlines() if hyp.is_file() else None
        out.append(rec)
    return out


def _alternatives(records: list[dict], second: list[dict]) -> dict[str, dict[str, dict]]:
    """{run name: {device kind: its record}} of the first and the second records."""
    found: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in records:
        found[r["name"]][device_kind(r)] = r
    for r in second:
        name, kind = r["name"], device_kind(r)
        if name not in found:
            raise HfAttnInputError(f"runs/{MACHINE_DIR}/{name}.json has no runs/{name}.json: a second record is a run "
                                   "of runs/ trained again on another kind of machine; move it to runs/")
        if kind in found[name]:
            raise HfAttnInputError(f"runs/{MACHINE_DIR}/{name}.json and runs/{name}.json both trained on {kind}: a "
                                   "second record must come from another kind of machine; keep one of them")
        found[name][kind] = r
    return found


def one_kind_per_group(records: list[dict], second: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the records the report uses, one per run, in the order of ``records``; the other records of runs recorded
    on two kinds of machine). See the module's docstring for the rule."""
    found = _alternatives(records, second)
    use = {}
    for runs in group_records(records).values():
        names = [r["name"] for rs in runs.values() for r in rs]
        kinds = {device_kind(r) for rs in runs.values() for r in rs}
        covering = set.intersection(*(set(found[n]) for n in names))
        if len(kinds) > 1 and covering:
            kind = PREFERRED_KIND if PREFERRED_KIND in covering else sorted(covering)[0]
            use.update({n: found[n][kind] for n in names})
    chosen = [use.get(r["name"], r) for r in records]
    used = {id(r) for r in chosen}
    others = [r for n in found for r in found[n].values() if id(r) not in used]
    return chosen, others


def machines_line(runs: list[dict], effect_link: str = "#machine-effect") -> str:
    """Which machines a group's runs (``runs``: its records, as the table uses them) trained on: the runs per
    machine, and where the group mixes kinds of machine, which runs each kind trained (``effect_link``: the report's
    "Machine effect" section)."""
    counts = Counter(device(r) for r in runs)
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_kind[device_kind(r)].append(r)
    if len(counts) == 1:
        return f"Machine: {'the one run' if len(runs) == 1 else f'all {len(runs)} runs'} on {next(iter(counts))}."
    text = "Machines: " + "; ".join(f"{n} run{'s' if n > 1 else ''} on {d}" for d, n in sorted(counts.items()))
    if len(by_kind) == 1:
        return text + "."
    which = []
    for kind, rs in sorted(by_kind.items()):
        seeds = defaultdict(list)
        for r in sorted(rs, key=lambda r: r["spec"]["seed"]):
            seeds[r["spec"]["preset"]].append(str(r["spec"]["seed"]))
        which.append(f"{kind}: " + ", ".join(f"`{p}` seed{'s' if len(s) > 1 else ''} {', '.join(s)}"
                                             for p, s in seeds.items()))
    return (f"{text}. Two kinds of machine ({'; '.join(which)}): the same seed is not the same run on both "
            f"([Machine effect]({effect_link})).")


def _pair_row(a: dict, b: dict, used: set, spread: dict) -> tuple[str, dict]:
    ka, kb = device_kind(a), device_kind(b)
    spec = a["spec"]
    diff = b["results"]["bleu"] - a["results"]["bleu"]
    s = spread.get((group_key(spec), spec["preset"]))
    row = {"name": a["name"], "group": group_title(group_key(spec)), "preset": spec["preset"], "seed": spec["seed"],
           "bleu": {ka: a["results"]["bleu"], kb: b["results"]["bleu"]}, "difference": round(diff, 2),
           "seed_sd": None if s is None else round(s, 2), "used": ka if id(a) in used else kb}
    sd_text = "-" if s is None else f"{s:.1f}"
    return (f"| {row['group']} | {row['preset']} | {row['seed']} | {a['results']['bleu']:.1f} ({ka}) | "
            f"{b['results']['bleu']:.1f} ({kb}) | {diff:+.1f} | {sd_text} | {row['used']} |"), row


def machine_effect_section(chosen: list[dict], others: list[dict]) -> tuple[list[str], list[dict]]:
    """The "Machine effect" section: each run recorded on two kinds of machine (both finished), its BLEU on each,
    the difference, and its preset's BLEU standard deviation across the seeds of its group (the records the report
    uses); with the rows for report.json."""
    md = ['<a id="machine-effect"></a>', "", "## Machine effect", "",
          "The same seed is not the same run on two kinds of machine: dropout's random streams differ between CPU and "
          "CUDA, and so do the kernels' rounding. Runs trained again on another kind of machine (their second "
          f"records in `runs/{MACHINE_DIR}/`) show how far that moves BLEU, beside the spread of the preset's BLEU "
          "across seeds in the same group. A group's tables use the records of one kind of machine wherever that "
          f"kind has a record of every run of the group ({PREFERRED_KIND} first); otherwise they say which machines "
          "their runs come from.", ""]
    by_name = {r["name"]: r for r in chosen}
    spread = {}
    for key, runs in group_records(chosen).items():
        for preset, rs in runs.items():
            spread[(key, preset)] = sd([r["results"]["bleu"] for r in rs if r["status"] == "complete"])
    used = {id(r) for r in chosen}
    pairs = [sorted((by_name[o["name"]], o), key=lambda r: (device_kind(r) != PREFERRED_KIND, device_kind(r)))
             for o in others if o["status"] == "complete" and by_name[o["name"]]["status"] == "complete"]
    if not pairs:
        return md + [f"No run has a second record yet (`runs/{MACHINE_DIR}/<name>.json`).", ""], []
    md += ["| group | preset | seed | BLEU, first kind | BLEU, second kind | difference (second - first) | the preset's "
           "BLEU sd across seeds | the tables use |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for a, b in sorted(pairs, key=lambda p: (group_key(p[0]["spec"]), p[0]["spec"]["preset"], p[0]["spec"]["seed"])):
        line, row = _pair_row(a, b, used, spread)
        md.append(line)
        rows.append(row)
    diffs = [abs(r["difference"]) for r in rows]
    sds = [r["seed_sd"] for r in rows if r["seed_sd"] is not None]
    within = [r for r in rows if r["seed_sd"] is not None and abs(r["difference"]) <= r["seed_sd"]]
    md += ["", f"Mean absolute difference between the two machines: {statistics.mean(diffs):.1f} BLEU over "
               f"{len(rows)} run{'s' if len(rows) > 1 else ''}"
               + (f"; the same presets' standard deviation across seeds: {min(sds):.1f} to {max(sds):.1f}; "
                  f"{len(within)} of {len(rows)} differences are within their preset's seed sd." if sds else "."),
           ""]
    md += [f"- `{r['name']}` on {device_kind(r)}: the record of `{r['same_run_as']['record']}` "
           f"({' '.join(r['same_run_as']['flags'])}): {r['same_run_as']['why']}."
           for pair in pairs for r in pair if r.get("same_run_as")]
    return md + ([""] if md[-1] else []), rows
