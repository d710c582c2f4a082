#!/usr/bin/env python
"""Write the generated tables of docs/api.md (the configuration fields and every variant's hyperparameters: name,
type, default, valid values, paper symbol) from their declarations (`hf_attn/docgen/api_tables.py` says how).

    python scripts/write_api_tables.py      # after changing a config field or a variant's `Hyperparameter`s

tests/test_api_docs.py fails while the block differs from what this writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_attn.docgen.api_tables import write_api_tables
from hf_attn.docgen.rewrite import rewrite

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the repository root (default: this script's)")
    sys.exit(rewrite(write_api_tables, "the API tables are", p.parse_args().root))
