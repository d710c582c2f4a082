#!/usr/bin/env python
"""Write the documentation's citations from `CITATIONS` (hf_attn/modeling/citations.py): the paper and sites
columns of the variants tables in README.md and docs/index.md, and the citation block under the title of each
docs/papers/<key>.md page (`hf_attn/reproduce/citation_docs.py` says what goes where).

    python scripts/write_citations.py            # after changing a citation, a variant's presets or a table row

tests/test_citations.py fails while a block differs from what this writes.
"""

from __future__ import annotations

import sys

from _rewrite import rewrite_main

from hf_attn.reproduce.citation_docs import write_citations

if __name__ == "__main__":
    sys.exit(rewrite_main(__doc__, write_citations, "the citations are"))
