"""The "What we measured" section of each paper's documentation page, generated from the report's summary.

`hf-attn reproduce --docs DOCS_DIR` (and `write_report(..., docs=...)`) rewrites the block between `BLOCK_START`
and `BLOCK_END` in ``DOCS_DIR/papers/<page>.md`` for every paper of `PAPERS` (the pages, `docgen/pages.py`), from
the same summary that ``report.json`` holds, so the pages quote the report and nothing typed by hand:

- the paper's claims as the report judges them (one row per group of runs), with the report's explanation where a
  claim does not hold;
- BLEU and chrF across seeds of the paper's presets beside softmax, in each group of the adopted recipe (no extra
  flags), with the seed-aware ΔBLEU where both have enough seeds;
- the recipe-sensitivity experiments that ran one of the paper's presets, with their conclusion.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..docgen.pages import PAPER_PAGE, PAPERS, paper_presets
from ..errors import HfAttnInputError
from ..io_utils import replace_marked_block
from .claims import delta_ci
from .seeds import MIN_SEEDS, mean_sd, p_text

BLOCK_START, BLOCK_END = "<!-- paper-results:start -->", "<!-- paper-results:end -->"
REPORT_LINK = "../../results/REPORT.md"  # from a paper page (docs/papers/) to the report
FLAGGED_GROUP = re.compile(r"_x[0-9a-f]{6}$")  # `seeds.group_name` of a group run with extra flags


def _report_anchors(text: str) -> str:
    """The report's own links (``](#anchor)``) made to point into the report from a paper page."""
    return text.replace("](#", f"]({REPORT_LINK}#")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_part(summary: dict, paper: str) -> list[str]:
    claims = [c for c in summary.get("claims", []) if c["paper"] == paper]
    if not claims:
        return []
    lines = [f"The paper's claims, as [the report]({REPORT_LINK}#what-the-papers-claim-and-what-we-see) judges them "
             "(per group of runs of the adopted recipe, only where every preset a claim reads has enough seeds):", "",
             "| claim | criterion | group | what we see | verdict |", "|---|---|---|---|---|"]
    for c in claims:
        for i, seen in enumerate(c["seen"] or [{"setup": "-", "observed": "-", "verdict": c["verdict"]}]):
            head = (_cell(c["claim"]), _cell(c["criterion"])) if i == 0 else ("", "")
            group = seen.get("title", seen["setup"])  # a benchmark row names its file, a group its title
            lines.append(f"| {head[0]} | {head[1]} | {_cell(group)} | {_cell(seen['observed'])} | "
                         f"{_cell(seen['verdict'])} |")
    notes = [f"- **{c['claim']}** ({c['verdict']}). {_report_anchors(c['explanation'])}" for c in claims
             if c.get("explanation")]
    return lines + ([""] + ["Where a claim does not hold, the report's explanation:", ""] + notes if notes else [])


def across_seeds_part(summary: dict, paper: str) -> list[str]:
    presets = paper_presets(paper)
    rows = []
    for name, group in summary.get("across_seeds", {}).items():
        if FLAGGED_GROUP.search(name):
            continue  # an experiment's arm: in the experiments below
        for preset in [p for p in ("softmax", *presets) if p in group["presets"]]:
            if preset == "softmax" and not any(p in group["presets"] for p in presets):
                break
            d = group["presets"][preset]
            base = group["presets"].get("softmax")
            vs, n = d.get("vs_softmax"), min(len(d["seeds"]), len(base["seeds"])) if base else 0
            delta = ("(baseline)" if preset == "softmax" else "no softmax run" if base is None else
                     f"{delta_ci(vs['bleu'])}, p {p_text(vs['bleu']['p_value'])}" if vs else
                     f"not enough seeds (n={n})" if n < MIN_SEEDS else "-")
            seeds = ", ".join(str(s) for s in d["seeds"])
            rows.append(f"| {group['title']} | {preset} | {seeds} | {mean_sd(d['bleu'])} | {mean_sd(d['chrf'])} | "
                        f"{delta} |")
    if not rows:
        return []
    return [f"BLEU and chrF across training seeds ([the report]({REPORT_LINK}#across-seeds); the adopted recipe, no "
            "extra flags; ΔBLEU against softmax with its seed-aware 95% interval, given where both presets have "
            "enough seeds):", "",
            "| group | preset | seeds | BLEU mean ± sd | chrF mean ± sd | ΔBLEU vs softmax [95% CI] |",
            "|---|---|---|---|---|---|", *rows]


def experiments_part(summary: dict, paper: str) -> list[str]:
    presets = set(paper_presets(paper))
    out = []
    for e in summary.get("experiments", []):
        if presets & {c["cell"].split("@", 1)[0] for c in e["cells"]}:
            rules = e.get("rules", [])
            met = f" {sum(r['verdict'] == 'met' for r in rules)} of {len(rules)} rules met." if rules else ""
            conclusion = f" {e['conclusion']}" if e.get("conclusion") else ""
            out.append(f"- [{e['title']} (`{e['id']}`)]({REPORT_LINK}#experiment-{e['id']}):{met}{conclusion}")
    return (["Recipe-sensitivity experiments that ran this paper's presets (their questions, cells and rules were "
             "fixed before the runs):", ""] + out) if out else []


def paper_block(summary: dict, paper: str) -> str:
    """The Markdown between the markers of ``paper``'s page."""
    parts = [p for p in (claims_part(summary, paper), across_seeds_part(summary, paper),
                         experiments_part(summary, paper)) if p]
    body = [f"Generated by `hf-attn reproduce --docs` from the report's summary (`results/report.json`); do not edit "
            "by hand."]
    for p in parts:
        body += [""] + p
    if not parts:
        body += ["", "No run of this paper's presets is recorded yet."]
    return "\n".join(body)


def paper_page_paths(docs_dir: Path) -> dict[str, Path]:
    """paper -> its page under ``docs_dir`` (``papers/<page>.md``), the pages `update_paper_pages` rewrites."""
    return {paper: Path(docs_dir) / PAPER_PAGE.format(page) for paper, (page, _) in PAPERS.items()}


def update_paper_pages(docs_dir: Path, summary: dict) -> list[Path]:
    """Rewrite the block of every paper's page under ``docs_dir``; a page without the markers is an error."""
    written = []
    for paper, path in paper_page_paths(docs_dir).items():
        if not path.is_file() or not replace_marked_block(path, BLOCK_START, BLOCK_END, paper_block(summary, paper)):
            raise HfAttnInputError(f"{path}: no block between {BLOCK_START} and {BLOCK_END}; add the two marker "
                                    "lines where the paper's measured results belong")
        written.append(path)
    return written
