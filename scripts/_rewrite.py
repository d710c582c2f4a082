"""The shared command line of the scripts that rewrite generated documentation blocks (`write_citations.py`,
`write_api_tables.py`): ``--root``, one error line, and what was rewritten."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hf_attn.errors import HfAttnInputError


def rewrite_main(doc: str, write, what: str, argv=None) -> int:
    """Parse ``--root``, call ``write(root)`` (the paths it changed), print them, or that ``what`` is up to date."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                   help="the repository root (default: this script's)")
    a = p.parse_args(argv)
    if not (a.root / "README.md").is_file():
        p.error(f"--root {a.root}: no README.md there; give the repository's root directory")
    try:
        changed = write(a.root)
    except HfAttnInputError as e:
        print(f"{write.__name__}: error: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print(f"{what} up to date")
    return 0
