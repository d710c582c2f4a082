"""The documentation site in docs/: it builds with `mkdocs build --strict`, its generated blocks are what the
generators write from results/, every preset and hyperparameter is on its paper's page, and the worked example of
adding a paper (docs/contributing.md) still works when built from the page's own code."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf_attn
from hf_attn.docgen import citation_docs
from hf_attn.docgen.pages import PAPERS
from hf_attn.errors import HfAttnInputError
from hf_attn.report import paper_pages

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed: pip install -e '.[dev]' installs the documentation tools")
def test_mkdocs_build_strict(tmp_path):
    """A broken link, a missing page, a page left out of the nav or an API name that does not resolve fails here."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site = tmp_path / "site"
    report = (site / "results" / "REPORT" / "index.html").read_text(encoding="utf-8")
    assert "hf-attn reproduction report" in report  # served from results/ by docs/_hooks/results.py
    assert 'href="../../results/REPORT/#experiment-gmm-gate"' in (site / "papers" / "gmm" / "index.html").read_text()
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in hf_attn.__all__ if f'id="hf_attn.{name}"' not in api]
    assert not missing, f"public names missing from the API reference: {missing}"


def test_paper_pages_hold_what_the_report_gives(tmp_path):
    """Each paper page's "What we measured" block is what `hf-attn reproduce --docs` writes from results/."""
    summary = json.loads((ROOT / "results" / "report.json").read_text(encoding="utf-8"))
    copy = tmp_path / "docs"
    shutil.copytree(DOCS / "papers", copy / "papers")
    written = paper_pages.update_paper_pages(copy, summary)
    assert len(written) == len(PAPERS)
    for path in written:
        committed = (DOCS / "papers" / path.name).read_text(encoding="utf-8")
        assert path.read_text(encoding="utf-8") == committed, f"docs/papers/{path.name}: run hf-attn reproduce --docs"
        block = committed.split(paper_pages.BLOCK_START, 1)[1].split(paper_pages.BLOCK_END, 1)[0]
        assert "| group | preset | seeds |" in block  # every paper has recorded runs


def test_the_retrofit_advice_in_python_md_is_what_the_report_gives(tmp_path):
    """docs/python.md's retrofit block is what `hf-attn reproduce --docs` writes from results/."""
    from hf_attn.report.retrofit_report import PYTHON_PAGE, update_python_page

    summary = json.loads((ROOT / "results" / "report.json").read_text(encoding="utf-8"))
    shutil.copy(DOCS / PYTHON_PAGE, tmp_path / PYTHON_PAGE)
    assert update_python_page(tmp_path, summary["retrofit"]) == tmp_path / PYTHON_PAGE
    assert (tmp_path / PYTHON_PAGE).read_text(encoding="utf-8") == (DOCS / PYTHON_PAGE).read_text(encoding="utf-8"), \
        "docs/python.md: run hf-attn reproduce --report_only --output_dir results --readme README.md --docs docs"
    (tmp_path / PYTHON_PAGE).write_text("# no markers\n")
    with pytest.raises(HfAttnInputError, match="no block between <!-- retrofit-summary:start -->"):
        update_python_page(tmp_path, summary["retrofit"])


def test_paper_page_without_markers_is_one_clear_error(tmp_path):
    (tmp_path / "papers").mkdir()
    for _, (name, _) in PAPERS.items():
        (tmp_path / "papers" / f"{name}.md").write_text("# a page\n")
    with pytest.raises(HfAttnInputError, match="no block between <!-- paper-results:start -->"):
        paper_pages.update_paper_pages(tmp_path, {})


def test_every_preset_and_hyperparameter_is_on_its_paper_page():
    documented = set()
    for paper, (name, variants) in PAPERS.items():
        text = page(f"papers/{name}.md")
        for variant in variants:
            cls = hf_attn.ATTENTION_VARIANTS[variant]
            names = [p.name for p in cls.presets] + [h.name for h in cls.hyperparameters]
            fenced = re.findall(r"```.*?\n(.*?)```", text, re.S)
            inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
            spans = " ".join(fenced + inline)  # names inside code, also `sigma = hard_gaussian_std = 1`
            missing = [n for n in names if not re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", spans)]
            assert not missing, f"docs/papers/{name}.md does not mention {missing}"
            documented.add(variant)
    # the baseline has no paper page of its own: its preset is in the ReLA paper's table (Table 1, row 1)
    assert set(hf_attn.ATTENTION_VARIANTS) - documented == {"softmax"}
    assert "`softmax`" in page("papers/rela.md")


def test_generated_blocks_live_in_the_docs_only():
    """Each generated block is where its writer looks for it; of the report's blocks, the README keeps the reproduce
    headline alone (besides its variants table, whose citations are written from CITATIONS)."""
    markers = ["benchmark", "compile", "reproduce-headline", "paper-results", "aux-objective-presets",
               "variants-table", "citation", "retrofit-summary"]
    files = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    where = {m: [f.relative_to(ROOT).as_posix() for f in files if f"<!-- {m}:start -->" in f.read_text()]
             for m in markers}
    assert where == {
        "benchmark": ["docs/speed.md"],
        "compile": ["docs/speed.md"],
        "reproduce-headline": ["README.md"],
        "paper-results": sorted(f"docs/papers/{name}.md" for name, _ in PAPERS.values()),
        "aux-objective-presets": ["docs/transformers-scripts.md"],
        "variants-table": sorted(citation_docs.TABLE_FILES),
        "citation": sorted(f"docs/papers/{name}.md" for name, _ in PAPERS.values()),
        "retrofit-summary": ["docs/python.md"],
    }


# the citations (one table, every generated place agrees with it): tests/test_citations.py


def test_every_script_is_named_in_the_docs():
    """scripts/ holds what people run: each of its files is named (``scripts/<file>``) on a page of docs/, the one
    that says when to run it; a helper that nobody runs belongs in the package or beside the script that uses it."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS.rglob("*.md"))
    scripts = sorted(path.name for path in (ROOT / "scripts").iterdir() if path.is_file())
    assert len(scripts) > 10 and "benchmark.py" in scripts
    unnamed = [name for name in scripts if f"scripts/{name}" not in text]
    assert not unnamed, f"scripts/ files no page of docs/ names: {unnamed}"


@pytest.mark.slow
def test_python_page_snippet_runs(tmp_path):
    snippet = re.search(r"# Using it from Python\n\n```python\n(.*?)\n```", page("python.md"), re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "my-rela-model" / "model.safetensors").exists()


# ------------------------------------------------------------------------------------ the worked example
CONTRIBUTING = page("contributing.md")
EXAMPLE_FILES = ("hf_attn/modeling/attention_qknorm.py", "docs/papers/qknorm.md")  # what the example creates


def titled_block(title: str) -> str:
    """The code block of docs/contributing.md with this title."""
    m = re.search(r'```python title="' + re.escape(title) + r'"\n(.*?)\n```', CONTRIBUTING, re.S)
    assert m, f"docs/contributing.md has no code block titled {title!r}"
    return m.group(1) + "\n"


def test_contributing_names_files_that_exist():
    """Every repository path the steps name exists (the files the example itself creates aside)."""
    paths = set(re.findall(r"`((?:hf_attn|tests|docs|scripts)/[\w./-]+\.(?:py|md)|mkdocs\.yml|README\.md)`",
                           CONTRIBUTING))
    paths |= set(re.findall(r'title="((?:hf_attn|tests|docs)/[\w./-]+\.py)', CONTRIBUTING))
    assert "hf_attn/modeling/registry.py" in {p.split(":")[0] for p in paths}
    missing = sorted(p for p in paths if p not in EXAMPLE_FILES and not (ROOT / p).exists())
    assert not missing, f"docs/contributing.md names files that do not exist: {missing}"
    for name in ("PAPERS", "CLAIMS"):  # step 7 names these tables
        assert name in CONTRIBUTING
    assert "PAPERS" in dir(__import__("hf_attn.docgen.pages", fromlist=["x"]))
    assert "CLAIMS" in dir(__import__("hf_attn.report.claims", fromlist=["x"]))


@pytest.mark.slow
def test_adding_a_paper_as_the_contributing_page_says(tmp_path):
    """Steps 2-5 of docs/contributing.md on a copy of the package and of the contract tests: the page's variant file,
    its citation, its two registry lines and its equation in tests/contract/reference.py, then the contract
    (tests/contract -k qknorm: the returned weights are the equation's) and the preset contract (tests/test_presets.py -k qknorm) on the new preset."""
    package = tmp_path / "hf_attn"
    shutil.copytree(ROOT / "hf_attn", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "modeling" / "attention_qknorm.py").write_text(titled_block("hf_attn/modeling/attention_qknorm.py"))
    citations = package / "modeling" / "citations.py"
    text = citations.read_text()
    assert text.rstrip().endswith("}"), "citations.py changed shape: update step 3 of docs/contributing.md"
    citations.write_text(text.rstrip()[:-1] + titled_block("hf_attn/modeling/citations.py: CITATIONS") + "}\n")
    registry = package / "modeling" / "registry.py"
    text = registry.read_text()
    imports = re.findall(r"^from \.attention_\w+ import .*$", text, re.M)
    tuple_end = re.search(r"^( +)\w+Attention,\n(\s*\)\n)", text, re.M)
    assert imports and tuple_end, "registry.py changed shape: update step 3 of docs/contributing.md"
    text = text.replace(imports[-1], imports[-1] + "\n" + titled_block("hf_attn/modeling/registry.py: import").strip())
    last = tuple_end.group(0)
    text = text.replace(last, last[: -len(tuple_end.group(2))] + titled_block(
        "hf_attn/modeling/registry.py: ATTENTION_VARIANTS") + tuple_end.group(2))
    registry.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    tests = tmp_path / "tests"
    shutil.copytree(ROOT / "tests", tests, ignore=shutil.ignore_patterns("__pycache__"))
    reference = tests / "contract" / "reference.py"
    text = reference.read_text()
    table = re.search(r"^EQUATIONS = \{\n(.*?)^\}\n", text, re.M | re.S)
    assert table, "tests/contract/reference.py changed shape: update step 4 of docs/contributing.md"
    text = text.replace(table.group(0), titled_block("tests/contract/reference.py: qknorm_weights") + "\n\n"
                        + table.group(0)[:-2] + titled_block("tests/contract/reference.py: EQUATIONS") + "}\n")
    reference.write_text(text)
    # one fresh interpreter: the package copy lists the new preset, then runs the tests (a second interpreter
    # for the listing alone would only import torch and transformers again)
    listed_then_tested = ("import sys, hf_attn; p = hf_attn.PRESETS['qknorm']; "
                          "print(hf_attn.__file__, p.overrides, p.paper, flush=True); "
                          "import pytest; sys.exit(pytest.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", listed_then_tested, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tests / "test_presets.py"), str(tests / "contract"), "-k", "qknorm"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    listed = proc.stdout.splitlines()[0] if proc.stdout else ""
    assert str(package) in listed and "Henry" in listed, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b[1-9]\d passed\b", proc.stdout), proc.stdout[-2000:]  # both bases, every contract test
