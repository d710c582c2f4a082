"""One citations table (hf_attn/modeling/citations.py), and every place that cites a paper agrees with it: the
README's and docs/index.md's variants tables, each paper page's citation and BibTeX blocks, CITATION.cff, the model
cards' Citation block, the presets and `hf-attn presets --verbose` / `--bibtex`."""

from __future__ import annotations

import dataclasses
import re
import runpy
import shutil
import sys
from pathlib import Path

import pytest
import yaml

import hf_attn
from hf_attn.cli import presets as presets_command
from hf_attn.docgen import citation_cff, citation_docs
from hf_attn.docgen.pages import PAPER_PAGE, PAPERS
from hf_attn.errors import HfAttnInputError
from hf_attn.modeling.citations import CITATIONS, HF_ATTN, Citation, cited
from hf_attn.training import cards
from hf_attn.version import __version__

ROOT = Path(__file__).resolve().parents[1]
# where a paper's page may be: its ACL Anthology page, its PMLR page, or its arXiv abstract
PAGE_URL = re.compile(r"https://(aclanthology\.org/[\w.-]+|proceedings\.mlr\.press/v\d+/\w+\.html|arxiv\.org/abs/"
                      r"\d{4}\.\d{4,5})")


def bibtex_fields(entry: str) -> tuple[str, str, dict]:
    """(type, key, {field: value}) of one BibTeX entry as `Citation.bibtex` writes it (one field a line)."""
    head = re.match(r"@(\w+)\{([^,\s]+),\n", entry)
    assert head and entry.endswith("\n}"), entry
    fields = dict(re.findall(r"^  (\w+) = \{(.*)\},?$", entry, re.M))
    assert len(fields) == entry.count("\n") - 1, f"a field of {head.group(2)} is not one line: {entry}"
    return head.group(1), head.group(2), fields


# ------------------------------------------------------------------------------------------ the table itself
def test_every_entry_is_complete_and_its_identifiers_agree():
    keys = [c.key for c in CITATIONS.values()]
    assert len(set(keys)) == len(keys), f"BibTeX keys used twice: {keys}"
    for name, c in CITATIONS.items():
        assert c.kind in ("inproceedings", "misc") and 1900 < c.year < 2100 and c.title and c.venue, name
        assert all(re.fullmatch(r"[^,]+, [^,]+", a) for a in c.authors), f"{name}: authors as 'Family, Given'"
        assert PAGE_URL.fullmatch(c.url), f"{name}: {c.url!r} is not an ACL Anthology, PMLR or arXiv page"
        if c.url.startswith("https://aclanthology.org/"):  # the Anthology's id is the DOI's suffix
            assert c.doi == "10.18653/v1/" + c.url.rsplit("/", 1)[1], name
        if c.url.startswith("https://arxiv.org/abs/"):
            assert c.eprint == c.url.rsplit("/", 1)[1], name
        assert not c.pages or re.fullmatch(r"\d+--\d+", c.pages), name
        assert c.kind == "inproceedings" or c.eprint, f"{name}: a preprint needs its arXiv id"


def test_bibtex_entries_carry_the_table():
    for name, c in CITATIONS.items():
        kind, key, fields = bibtex_fields(c.bibtex)
        assert (kind, key, fields["year"]) == (c.kind, c.key, str(c.year)), name
        assert fields["title"] == "{" + c.title + "}"
        names = fields["author"].split(" and ")
        assert [n.split(",")[0] for n in names] == c.surnames, name
        assert fields.get("url") == c.url and fields.get("doi", "") == c.doi and fields.get("pages", "") == c.pages
        assert fields["author"].isascii(), f"{name}: non-ASCII letters in BibTeX names: {fields['author']}"
        assert c.bibtex.count("{") == c.bibtex.count("}"), name
    assert "Andr{\\'e} F. T." in CITATIONS["entmax"].bibtex and "{\\L}ukasz" in CITATIONS["transformer"].bibtex


def test_one_line_and_short_forms():
    assert str(CITATIONS["rela"]) == "Zhang, Titov & Sennrich 2021, Sparse Attention with Linear Units (EMNLP)"
    assert str(CITATIONS["ran"]).startswith("Zeng et al. 2021, Recurrent Attention")  # four authors or more
    assert CITATIONS["gmm"].short.startswith("Zhang & Feng 2021, Modeling") and CITATIONS["rela"].short.startswith(
        "Zhang et al. 2021, Sparse")
    assert citation_docs.short("rela") == ("Zhang et al. 2021, [*Sparse Attention with Linear Units*]"
                                           "(https://aclanthology.org/2021.emnlp-main.523)")
    untitled = dataclasses.replace(CITATIONS["rela"], url="")
    assert f"{untitled.short_authors} {untitled.year}, *{untitled.title}*" == "Zhang et al. 2021, *Sparse Attention " \
        "with Linear Units*"


def test_every_preset_cites_entries_of_the_table():
    """Every preset's ``paper`` is a table entry's one-line form (a baseline's: its own paper, then "; as compared
    in" the paper comparing with it), so no citation is typed twice."""
    values = {str(c) for c in CITATIONS.values()}
    typed = {name: p.paper for name, p in hf_attn.PRESETS.items() if not set(p.paper.split("; as compared in ")) <=
             values}
    assert not typed, f"presets citing a paper typed outside hf_attn/modeling/citations.py: {typed}"
    assert all(isinstance(p.paper, str) for p in hf_attn.PRESETS.values())
    assert cited(hf_attn.PRESETS["sparsemax"].paper) == [CITATIONS["sparsemax"], CITATIONS["rela"]]
    papers = {v: citation_docs.variant_paper(v) for v in ("softmax", "sparsemax", "entmax15", "hard-gaussian")}
    assert papers == {"softmax": "transformer", "sparsemax": "sparsemax", "entmax15": "entmax",
                      "hard-gaussian": "hard-coded-gaussian"}


# ------------------------------------------------------------------------ the documentation and CITATION.cff
def test_the_docs_and_citation_cff_are_what_the_table_gives():
    """The README's and the index's variants tables, each paper page's citation and BibTeX blocks and CITATION.cff
    are written from CITATIONS (and the variants' sites), by the one command."""
    written = citation_docs.citation_docs(ROOT)
    assert ROOT / "CITATION.cff" in written and ROOT / "README.md" in written
    for path, text in written.items():
        assert path.is_file() and path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)}: its citations differ from hf_attn/modeling/citations.py; run "
            f"{citation_docs.COMMAND}")
    for page, _ in PAPERS.values():
        text = (ROOT / "docs" / PAPER_PAGE.format(page)).read_text(encoding="utf-8")
        block = text.split(citation_docs.BIBTEX_START)[1].split(citation_docs.BIBTEX_END)[0]
        entries = re.findall(r"^@.*?^\}$", block, re.M | re.S)
        assert entries == [CITATIONS[k].bibtex for k in citation_docs.page_papers(page)], page
        assert text.rstrip().endswith(citation_docs.BIBTEX_END) and "## How to cite" in text


def test_citation_cff_is_cff_1_2_0_of_hf_attn_and_its_papers():
    data = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert {"cff-version", "message", "title", "authors"} <= set(data)  # the schema's required keys
    assert data["cff-version"] == "1.2.0" and data["type"] == "software"
    assert (data["title"], data["version"], data["repository-code"]) == (HF_ATTN.title, __version__, HF_ATTN.url)
    assert data["authors"] == [{"name": a} for a in HF_ATTN.authors]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert data["license"] == "Apache-2.0" and 'license = { text = "Apache-2.0" }' in pyproject
    refs = data["references"]
    assert [r["title"] for r in refs] == [c.title for c in CITATIONS.values()]
    for ref, c in zip(refs, CITATIONS.values()):
        assert [a["family-names"] for a in ref["authors"]] == c.surnames and ref["year"] == c.year
        assert ref["url"] == c.url and ref.get("doi", "") == c.doi
        assert ref["type"] in ("conference-paper", "article") and set(ref) <= {
            "type", "title", "authors", "year", "collection-title", "journal", "start", "end", "publisher", "doi",
            "url"}
    assert citation_cff.citation_cff() == (ROOT / "CITATION.cff").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_citations_command_rewrites_a_changed_citation(tmp_path, monkeypatch, capsys):
    for name in (*citation_docs.TABLE_FILES, "CITATION.cff",
                 *(f"docs/papers/{n}.md" for n, _ in PAPERS.values())):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert citation_docs.write_citations(tmp_path) == []
    old = CITATIONS["sparsemax"]
    renamed = dataclasses.replace(old, title="Sparsemax Renamed")
    sparsemax = hf_attn.ATTENTION_VARIANTS["sparsemax"]  # its presets read CITATIONS when the module was imported
    monkeypatch.setattr(sparsemax, "presets", tuple(dataclasses.replace(
        p, paper=p.paper.replace(str(old), str(renamed))) for p in sparsemax.presets))
    monkeypatch.setitem(CITATIONS, "sparsemax", renamed)
    changed = citation_docs.write_citations(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in changed) == ["CITATION.cff", "README.md",
                                                                           "docs/index.md", "docs/papers/rela.md"]
    assert f"Martins & Astudillo 2016, [*Sparsemax Renamed*]({old.url})" in (tmp_path / "README.md").read_text()
    rela = (tmp_path / "docs/papers/rela.md").read_text()
    assert f"Martins & Astudillo 2016, [*Sparsemax Renamed*]({old.url}) (ICML), for `sparsemax`" in " ".join(
        rela.split()) and "title = {{Sparsemax Renamed}}" in rela
    assert 'title: "Sparsemax Renamed"' in (tmp_path / "CITATION.cff").read_text()
    page_path = tmp_path / "docs" / "papers" / "gmm.md"
    page_path.write_text(page_path.read_text().split(citation_docs.BIBTEX_START)[0])
    with pytest.raises(HfAttnInputError, match="gmm.md: no block between <!-- bibtex:start -->"):
        citation_docs.write_citations(tmp_path)
    page_path.write_text("# GMM\n")
    with pytest.raises(HfAttnInputError, match="gmm.md: no block between <!-- citation:start -->"):
        citation_docs.write_citations(tmp_path)
    # the script as a program (its __main__ block, in this process: a fresh interpreter would only import the
    # package again), on the package's own citations
    monkeypatch.undo()
    script = ROOT / "scripts" / "write_citations.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--root", str(tmp_path)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "citation:start" in err, err


# ------------------------------------------------------------------------------ the model cards and the CLI
def citation_section(card: str) -> str:
    return card.split("## Citation", 1)[1].split("\n## ", 1)[0]


def test_model_card_cites_the_presets_papers_and_hf_attn_in_bibtex():
    card = cards.render_model_card({"preset": "sparsemax", "base": "marian", "bleu": 1.0, "chrf": 2.0})
    section = citation_section(card)
    entries = re.findall(r"^@.*?^\}$", section.split("```bibtex\n", 1)[1].split("\n```", 1)[0], re.M | re.S)
    hf_attn_entry = dataclasses.replace(HF_ATTN, version=__version__).bibtex
    assert entries == [CITATIONS["sparsemax"].bibtex, CITATIONS["rela"].bibtex, hf_attn_entry]
    assert f"note = {{Version {__version__}}}" in hf_attn_entry
    for base in ("marian", "bart", "model"):  # every template has the block, in the package's copy too
        for folder in (ROOT / "model_cards", ROOT / "hf_attn" / "training" / "card_templates"):
            assert "## Citation\n\n$citation\n" in (folder / f"{base}.md").read_text(encoding="utf-8")
    # a model without a preset cites the papers of the variants in its layout, each once
    layout = {"encoder": ["rela", "softmax"], "decoder": ["rela", "rela"], "cross": ["gmm", "gmm"]}
    assert cards.card_papers(None, layout) == [CITATIONS["rela"], CITATIONS["transformer"], CITATIONS["gmm"]]
    assert cards.citation_block("custom", {}).count("@misc{hf-attn,") == 1


def test_presets_verbose_and_bibtex_print_each_presets_papers(capsys):
    assert presets_command.run(["--verbose"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, p in hf_attn.PRESETS.items():
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{name} "))
        papers = cited(p.paper)
        printed = [line.strip() for line in lines[start + 2: start + 2 + len(papers)]]
        assert printed == [f"{'as compared in ' if i else ''}{c}: {c.url}" for i, c in enumerate(papers)], name
    assert presets_command.run(["--bibtex", "hard-gaussian-cross"]) == 0
    assert capsys.readouterr().out == "\n\n".join(c.bibtex for c in (CITATIONS["hard-coded-gaussian"],
                                                                     CITATIONS["gmm"])) + "\n"
    from hf_attn.errors import HfAttnInputError  # the CLI prints it as its one line, exit code 2

    with pytest.raises(HfAttnInputError, match=r"--bibtex: no preset 'rela_g' \(did you mean 'rela-g'\?\)"):
        presets_command.run(["--bibtex", "rela_g"])


def test_citation_is_a_frozen_dataclass_with_the_old_string_form():
    c = CITATIONS["calibration"]
    assert isinstance(c, Citation) and dataclasses.is_dataclass(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.year = 2020
    assert f"{c}" == str(c) == ("Lu et al. 2021, Attention Calibration for Transformer in Neural Machine Translation "
                                "(ACL)")


def test_the_generated_citation_blocks_live_where_their_writers_look():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    where = {m: [f.relative_to(ROOT).as_posix() for f in files if m in f.read_text(encoding="utf-8")]
             for m in (citation_docs.BIBTEX_START, citation_docs.PAGE_START, "<!-- api-tables:start -->")}
    pages = sorted(f"docs/{PAPER_PAGE.format(name)}" for name, _ in PAPERS.values())
    assert where == {citation_docs.BIBTEX_START: pages, citation_docs.PAGE_START: pages,
                     "<!-- api-tables:start -->": ["docs/api.md"]}
