"""The documentation's paper pages: ``docs/papers/<page>.md`` for each paper of `PAPERS`, with the variants (and so
the presets) each page documents. Two writers fill blocks of these pages: `citation_docs` (the citation and BibTeX
blocks, from the code's citations) and the report (`report/paper_pages.py`: the "What we measured" block, from
the run records)."""

from __future__ import annotations

from ..modeling.registry import ATTENTION_VARIANTS

PAPER_PAGE = "papers/{}.md"  # under the docs directory
# the report's paper name (`report.claims.CLAIMS`) -> (its page, the variants whose presets the page documents)
PAPERS = {
    "ReLA": ("rela", ("sparsemax", "entmax15", "rela")),
    "GMM": ("gmm", ("gmm",)),
    "ReLUFormer": ("reluformer", ("reluformer",)),
    "RAN": ("ran", ("recurrent", "hard-gaussian", "synthesizer")),
    "Calibration": ("calibration", ("calibrated",)),
}


def paper_presets(paper: str) -> list[str]:
    """The presets a paper's page documents, in the order the variants declare them."""
    return [p.name for v in PAPERS[paper][1] for p in ATTENTION_VARIANTS[v].presets]
