"""What the scripts that rewrite generated documentation blocks share (`scripts/write_citations.py`,
`scripts/write_api_tables.py`, which parse their one flag, ``--root``): `write_changed` writes the files whose text
changed, and `rewrite` runs one writer on a repository root and prints what it rewrote, or one error line."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import HfAttnInputError


def write_changed(texts: dict[Path, str]) -> list[Path]:
    """Write each text to its path where the file is missing or differs; the paths written."""
    changed = []
    for path, text in texts.items():
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def rewrite(write, what: str, root: Path) -> int:
    """Call ``write(root)`` (the paths it changed) on the repository ``root`` and print them, or that ``what`` is up
    to date: 0. A root without a README.md, or an `HfAttnInputError` from ``write``: one error line, 2."""
    root = Path(root)
    try:
        if not (root / "README.md").is_file():
            raise HfAttnInputError(f"--root {root}: no README.md there; give the repository's root directory")
        changed = write(root)
    except HfAttnInputError as e:
        print(f"{write.__name__}: error: {e}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"rewrote {path}")
    if not changed:
        print(f"{what} up to date")
    return 0
