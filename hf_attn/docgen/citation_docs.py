"""The citations in the documentation and the repository, written from `CITATIONS` (hf_attn/modeling/citations.py),
where each one is typed once. `python scripts/write_citations.py` rewrites them; tests/test_citations.py fails while
one differs:

- each paper page, ``docs/papers/<key>.md`` for every page of `pages.PAPERS`, opens with the block between
  `PAGE_START` and `PAGE_END`: its paper's citation, ``CITATIONS[<key>]`` (its title linked to the publication),
  then the papers of the baselines it documents (the other variants of its `PAPERS` entry); it ends with the block
  between `BIBTEX_START` and `BIBTEX_END`: the BibTeX entries of the same papers;
- in the tables between `TABLE_START` and `TABLE_END` (`TABLE_FILES`: the README's variants, the documentation's
  papers), each row's ``paper`` cell cites the papers of the variants named in its ``variant`` cell (short form,
  titles linked), its ``sites`` cell, where the table has one, says where they may run, and its ``presets...`` cell,
  where the table has one, names their presets (`presets_text`); the other cells are left as written;
- ``CITATION.cff`` at the repository root: hf-attn's own entry (`citation_cff`).

A variant's paper is the `CITATIONS` entry its presets' ``paper`` begins with (a baseline's preset adds "; as
compared in <the paper that compares with it>"), so presets, model cards and docs cite one entry.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from ..errors import HfAttnInputError
from ..io_utils import with_marked_block
from ..modeling.citations import CITATIONS, Citation
from ..modeling.hyperparameters import SITES
from ..modeling.registry import ATTENTION_VARIANTS
from .citation_cff import CFF_FILE, citation_cff
from .pages import PAPER_PAGE, PAPERS
from .rewrite import write_changed

COMMAND = "python scripts/write_citations.py"
PAGE_START, PAGE_END = "<!-- citation:start -->", "<!-- citation:end -->"
BIBTEX_START, BIBTEX_END = "<!-- bibtex:start -->", "<!-- bibtex:end -->"
TABLE_START, TABLE_END = "<!-- variants-table:start -->", "<!-- variants-table:end -->"
TABLE_FILES = ("README.md", "docs/index.md")  # under the repository root
WIDTH = 116  # the line length of the pages' prose


def citation(key: str) -> Citation:
    if key not in CITATIONS:
        raise HfAttnInputError(f"CITATIONS has no entry {key!r} (hf_attn/modeling/citations.py); valid keys: "
                               f"{sorted(CITATIONS)}")
    return CITATIONS[key]


def _title(c: Citation) -> str:
    """The title in italics, linked to the publication's page when the entry has one."""
    return f"[*{c.title}*]({c.url})" if c.url else f"*{c.title}*"


def full(key: str) -> str:
    """Markdown: ``Authors Year, *Title* (Venue)``, the title linked."""
    c = citation(key)
    return f"{c.author_text} {c.year}, {_title(c)} ({c.venue})"


def short(key: str) -> str:
    """Markdown for a table cell: ``A et al. Year, *Title*``, the title linked."""
    c = citation(key)
    return f"{c.short_authors} {c.year}, {_title(c)}"


def variant_paper(variant: str) -> str:
    """The `CITATIONS` key of the paper ``variant`` implements: the entry all its presets' ``paper`` begins with."""
    presets = ATTENTION_VARIANTS[variant].presets
    keys = [k for k, c in CITATIONS.items() if presets and all(p.paper.startswith(str(c)) for p in presets)]
    if len(keys) != 1:
        raise HfAttnInputError(f"variant {variant!r}: its presets' `paper` should begin with one entry of CITATIONS "
                               f"(hf_attn/modeling/citations.py), found {keys or 'none'}")
    return keys[0]


def page_papers(page: str) -> dict[str, list[str]]:
    """The `CITATIONS` keys ``docs/papers/<page>.md`` cites -> the variants each is cited for: the page's paper
    first, then the papers of the baselines it documents."""
    if page not in CITATIONS:
        raise HfAttnInputError(f"docs/papers/{page}.md: CITATIONS has no entry {page!r}; a paper's page is named "
                               "after its key in hf_attn/modeling/citations.py")
    papers = {page: []}
    for v in next(v for p, v in PAPERS.values() if p == page):
        papers.setdefault(variant_paper(v), []).append(f"`{v}`")
    return papers


def page_block(page: str) -> str:
    """The citation block of ``docs/papers/<page>.md``."""
    baselines = {k: vs for k, vs in page_papers(page).items() if k != page}
    text = f"{full(page)}."
    if baselines:
        text += " The baselines' papers: " + "; ".join(f"{full(k)}, for {' and '.join(vs)}"
                                                      for k, vs in baselines.items()) + "."
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def bibtex_block(page: str) -> str:
    """The BibTeX block of ``docs/papers/<page>.md``: the entries of the papers its citation block cites."""
    entries = "\n\n".join(CITATIONS[k].bibtex for k in page_papers(page))
    return f"```bibtex\n{entries}\n```"


def sites_text(variants: list[str]) -> str:
    per_variant = ["all" if set(ATTENTION_VARIANTS[v].sites) == set(SITES) else ", ".join(ATTENTION_VARIANTS[v].sites)
                   for v in variants]
    return "; ".join(dict.fromkeys(per_variant))


def presets_text(variants: list[str], shown: int = 2) -> str:
    """The presets (what `--preset` and `from_preset` take) built on ``variants``: the first ``shown`` each variant
    declares, and how many more it has."""
    out = []
    for v in variants:
        names = [p.name for p in ATTENTION_VARIANTS[v].presets]
        out.append(", ".join(f"`{n}`" for n in names[:shown]) + (f" + {len(names) - shown} more" if len(names) > shown
                                                                  else ""))
    return "; ".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def table_block(block: str, where: str) -> str:
    """``block`` (a Markdown table, possibly with text around it) with each row's ``paper`` and ``sites`` cells
    written from the variants its ``variant`` cell names."""
    lines = block.strip("\n").split("\n")
    head = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    columns = _cells(lines[head]) if head is not None else []
    variant_col = next((i for i, c in enumerate(columns) if c.startswith("variant")), None)
    if variant_col is None or "paper" not in columns:
        raise HfAttnInputError(f"{where}: the block between {TABLE_START} and {TABLE_END} holds no table with a "
                               "'variant...' and a 'paper' column")
    for i in range(head + 2, len(lines)):
        if not lines[i].startswith("|"):
            break
        cells = _cells(lines[i])
        variants = [v for v in re.findall(r"`([\w-]+)`", cells[variant_col]) if v in ATTENTION_VARIANTS]
        if not variants:
            raise HfAttnInputError(f"{where}: the row {lines[i][:60]!r}... names no attention variant (in backticks)")
        cells[columns.index("paper")] = "; ".join(short(k) for k in dict.fromkeys(map(variant_paper, variants)))
        if "sites" in columns:
            cells[columns.index("sites")] = sites_text(variants)
        presets_col = next((i for i, c in enumerate(columns) if c.startswith("presets")), None)
        if presets_col is not None:
            cells[presets_col] = presets_text(variants)
        lines[i] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines)


def _block(text: str, start: str, end: str) -> str | None:
    return text.split(start, 1)[1].split(end, 1)[0] if start in text and end in text.split(start, 1)[1] else None


def citation_docs(root: Path) -> dict[Path, str]:
    """Each file with generated citations under the repository ``root`` -> its text with the blocks rewritten; a
    file without its markers is an error. A blank line ends a table before its end marker (GitHub would read the
    marker as one more row) and sets a page's citation apart as a paragraph of its own, on GitHub and in MkDocs."""
    out = {}
    for name in TABLE_FILES:
        path = Path(root) / name
        text = path.read_text(encoding="utf-8")
        old = _block(text, TABLE_START, TABLE_END)
        if old is None:
            raise HfAttnInputError(f"{path}: no block between {TABLE_START} and {TABLE_END} around its variants table")
        out[path] = with_marked_block(text, TABLE_START, TABLE_END, f"{table_block(old, name)}\n")
    for page, _ in PAPERS.values():
        path = Path(root) / "docs" / PAPER_PAGE.format(page)
        text = with_marked_block(path.read_text(encoding="utf-8"), PAGE_START, PAGE_END, f"\n{page_block(page)}\n")
        if text is None:
            raise HfAttnInputError(f"{path}: no block between {PAGE_START} and {PAGE_END}; add the two marker lines "
                                   "under the page's title, where its citation belongs")
        text = with_marked_block(text, BIBTEX_START, BIBTEX_END, bibtex_block(page))
        if text is None:
            raise HfAttnInputError(f"{path}: no block between {BIBTEX_START} and {BIBTEX_END}; add the two marker "
                                   "lines under a '## How to cite' heading at the end of the page")
        out[path] = text
    out[Path(root) / CFF_FILE] = citation_cff()
    return out


def write_citations(root: Path) -> list[Path]:
    """Rewrite the citation blocks under ``root``; the files that changed."""
    return write_changed(citation_docs(root))
