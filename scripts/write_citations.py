#!/usr/bin/env python
"""Write the documentation's citations from `CITATIONS` (hf_attn/modeling/citations.py): the paper and sites
columns of the variants tables in README.md and docs/index.md, and the citation block under the title of each
docs/papers/<key>.md page (`hf_attn/reproduce/citation_docs.py` says what goes where).

    python scripts/write_citations.py            # after changing a citation, a variant's presets or a table row

tests/test_citations.py fails while a block differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_attn.errors import HfAttnInputError
from hf_attn.reproduce.citation_docs import write_citations


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the repository root (default: this script's)")
    a = p.parse_args(argv)
    try:
        changed = write_citations(a.root)
    except HfAttnInputError as e:
        print(f"write_citations: error: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print("the citations are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
