#!/usr/bin/env python
"""Write the documentation's citations from `CITATIONS` (hf_attn/modeling/citations.py): the paper and sites
columns of the variants tables in README.md and docs/index.md, the citation and BibTeX blocks of each
docs/papers/<key>.md page, and CITATION.cff (`hf_attn/docgen/citation_docs.py` says what goes where).

    python scripts/write_citations.py            # after changing a citation, a variant's presets or a table row

tests/test_citations.py fails while a block differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_attn.docgen.citation_docs import write_citations
from hf_attn.docgen.rewrite import rewrite

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the repository root (default: this script's)")
    sys.exit(rewrite(write_citations, "the citations are", p.parse_args().root))
