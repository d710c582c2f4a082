"""``CITATION.cff`` (Citation File Format 1.2.0, https://citation-file-format.github.io/) for hf-attn itself, written
from `HF_ATTN` and `CITATIONS` (hf_attn/modeling/citations.py) by ``python scripts/write_citations.py``: the
software's entry (title, authors, version, repository, license) and, as its references, the papers it implements and
compares with. GitHub's "Cite this repository" and Zenodo read it."""

from __future__ import annotations

import dataclasses
import json

from ..modeling.citations import CITATIONS, HF_ATTN, Citation
from ..version import __version__

CFF_FILE = "CITATION.cff"  # at the repository root
LICENSE = "Apache-2.0"  # pyproject.toml's
MESSAGE = ("If you use hf-attn, please cite it as below, and cite the papers of the attention mechanisms you use "
           "(the references below).")


def _q(value) -> str:
    """A YAML scalar: strings double-quoted (a JSON string is a valid YAML one), numbers as they are."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else str(value)


def _authors(c: Citation, indent: str) -> list[str]:
    lines = []
    for a in c.authors:
        if "," in a:
            family, given = (x.strip() for x in a.split(",", 1))
            lines += [f"{indent}- family-names: {_q(family)}", f"{indent}  given-names: {_q(given)}"]
        else:
            lines.append(f"{indent}- name: {_q(a)}")
    return lines


def _reference(c: Citation) -> list[str]:
    """One entry of ``references``: a paper, as a conference paper (its proceedings) or an arXiv article."""
    kind = "conference-paper" if c.kind == "inproceedings" else "article"
    lines = [f"  - type: {kind}", f"    title: {_q(c.title)}", "    authors:", *_authors(c, "      "),
             f"    year: {c.year}"]
    if c.booktitle:
        lines.append(f"    collection-title: {_q(c.booktitle)}")
    if c.kind != "inproceedings" and c.venue == "arXiv":
        lines.append(f"    journal: {_q('arXiv preprint')}")
    if c.pages:
        start, end = c.pages.split("--")
        lines += [f"    start: {_q(start)}", f"    end: {_q(end)}"]
    if c.publisher:
        lines += ["    publisher:", f"      name: {_q(c.publisher)}"]
    if c.doi:
        lines.append(f"    doi: {_q(c.doi)}")
    if c.url:
        lines.append(f"    url: {_q(c.url)}")
    return lines


def hf_attn_citation() -> Citation:
    """`HF_ATTN` with the package's version."""
    return dataclasses.replace(HF_ATTN, version=__version__)


def citation_cff() -> str:
    """The text of ``CITATION.cff``."""
    c = hf_attn_citation()
    lines = [
        "# Written by `python scripts/write_citations.py` from hf_attn/modeling/citations.py: edit that table, not "
        "this file.",
        "cff-version: 1.2.0",
        f"message: {_q(MESSAGE)}",
        "type: software",
        f"title: {_q(c.title)}",
        "authors:", *_authors(c, "  "),
        f"version: {_q(c.version)}",
        f"repository-code: {_q(c.url)}",
        f"license: {LICENSE}",
        "keywords:", *(f"  - {_q(k)}" for k in ("neural machine translation", "attention", "transformers")),
        "references:",
    ]
    for paper in CITATIONS.values():
        lines += _reference(paper)
    return "\n".join(lines) + "\n"
