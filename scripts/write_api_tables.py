#!/usr/bin/env python
"""Write the generated tables of docs/api.md (the configuration fields and every variant's hyperparameters: name,
type, default, valid values, paper symbol) from their declarations (`hf_attn/reproduce/api_tables.py` says how).

    python scripts/write_api_tables.py      # after changing a config field or a variant's `Hyperparameter`s

tests/test_api_docs.py fails while the block differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_attn.errors import HfAttnInputError
from hf_attn.reproduce.api_tables import write_api_tables


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the repository root (default: this script's)")
    a = p.parse_args(argv)
    try:
        changed = write_api_tables(a.root)
    except HfAttnInputError as e:
        print(f"write_api_tables: error: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print("the API tables are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
