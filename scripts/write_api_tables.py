#!/usr/bin/env python
"""Write the generated tables of docs/api.md (the configuration fields and every variant's hyperparameters: name,
type, default, valid values, paper symbol) from their declarations (`hf_attn/reproduce/api_tables.py` says how).

    python scripts/write_api_tables.py      # after changing a config field or a variant's `Hyperparameter`s

tests/test_api_docs.py fails while the block differs from what this writes.
"""

from __future__ import annotations

import sys

from _rewrite import rewrite_main

from hf_attn.reproduce.api_tables import write_api_tables

if __name__ == "__main__":
    sys.exit(rewrite_main(__doc__, write_api_tables, "the API tables are"))
