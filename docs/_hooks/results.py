"""MkDocs hook: serve the committed results (results/REPORT.md and its plots, the benchmark and analysis outputs)
as pages of the site, so that the docs link them where they are in the repository.

The pages link results with the path that is right in the repository (``../results/REPORT.md`` from ``docs/x.md``,
``../../results/...`` from ``docs/papers/x.md``), which GitHub follows. MkDocs serves only files under ``docs/``,
so the hook adds results/REPORT.md and every file under ``results/`` that is not Markdown (the benchmarks' .md tables
are in docs/speed.md already; the per-run records and cached references stay out) to the site at ``results/...``,
and rewrites those links to point there. A link to a file that is not served stays as written and fails
``mkdocs build --strict``.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"
SKIPPED = ("runs", "references")  # thousands of translations: read them in the repository
REPORT = Path("REPORT.md")  # the one page; the other .md files under results/ are the benchmarks' tables
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_files(files, config):
    for path in sorted(RESULTS.rglob("*")):
        rel = path.relative_to(RESULTS)
        if path.is_file() and rel.parts[0] not in SKIPPED and (path.suffix != ".md" or rel == REPORT):
            files.append(File.generated(config, f"results/{rel.as_posix()}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith("results/"):  # the report links the docs as the repository has them
        return markdown.replace("](../docs/", "](../")  # (../docs/x.md): served at ../x.md
    if page.file.abs_src_path is None:
        return markdown
    here = Path(page.file.abs_src_path).parent

    def rewrite(m):
        target = m.group(2)
        if "://" in target:
            return m.group(0)
        resolved = (here / target).resolve()
        if RESULTS not in resolved.parents:
            return m.group(0)
        served = "results/" + resolved.relative_to(RESULTS).as_posix()
        new = posixpath.relpath(served, posixpath.dirname(page.file.src_uri) or ".")
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return LINK.sub(rewrite, markdown)
