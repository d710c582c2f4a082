#!/usr/bin/env python
"""Write hf_attn/cli/snapshot.json: what `hf-attn presets` prints and the flags `hf-attn train` has, so that both
answer without importing torch and transformers (`hf_attn/cli/snapshot.py` says how it is keyed).

    python scripts/write_cli_snapshot.py      # after changing hf_attn/modeling/, training/args.py or the commands

tests/cli/test_snapshot.py fails while the committed snapshot is out of date.
"""

from __future__ import annotations

import sys

from hf_attn.cli.snapshot import SNAPSHOT, write_snapshot


def main() -> int:
    print(f"rewrote {SNAPSHOT}" if write_snapshot() else f"{SNAPSHOT} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
