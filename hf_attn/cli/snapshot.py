"""A copy of what ``hf-attn presets`` prints and of the flags ``hf-attn train`` has, so that both answer in a
fraction of a second: building them imports torch and transformers' models (about 10 s on a 2-core machine).

``snapshot.json`` (beside this file) is written by ``python scripts/write_cli_snapshot.py`` and keyed by the files
its contents come from (the model code in ``modeling/``, ``training/args.py``, the two commands' modules) and by
transformers' version (the training and model config flags). When the key differs, as after editing a variant or
with another transformers, the commands build their answers from the registry as before: never a stale answer.
tests/cli/test_snapshot.py fails while the committed copy is out of date.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path

from ..errors import HfAttnInputError
from .flags import pre_parse_base, unknown_flags_line

SNAPSHOT = Path(__file__).with_name("snapshot.json")
PACKAGE = Path(__file__).resolve().parents[1]
SOURCES = ("modeling/*.py", "training/args.py", "cli/flags.py", "cli/presets.py", "cli/presets_text.py",
           "cli/snapshot.py", "cli/train_args.py")
BASES = ("marian", "bart")


def transformers_version() -> str | None:
    """The installed transformers' version (read without importing it), or None."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def written_with_other_transformers() -> str | None:
    """The transformers version the committed snapshot was written with, when another one is installed (the key,
    which holds the version, cannot match: the commands answer from the registry); else None."""
    try:
        written = json.loads(SNAPSHOT.read_text(encoding="utf-8")).get("transformers")
    except (OSError, ValueError):
        return None
    return written if written != transformers_version() else None


def key() -> str:
    """sha256 of the source files and transformers' version."""
    h = hashlib.sha256()
    version = transformers_version()
    h.update(version.encode() if version is not None else b"no transformers")
    for pattern in SOURCES:
        for path in sorted(PACKAGE.glob(pattern)):
            h.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def current_snapshot() -> dict | None:
    """The snapshot when it matches the code and transformers here; else None."""
    try:
        snap = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return snap if snap.get("key") == key() else None


def unknown_train_flags(argv: list[str]) -> None:
    """``hf-attn train`` with a flag it does not have: the one error line, before torch loads (when the snapshot is
    current; otherwise `train_args.parse_train_args` gives the same line after building the parser)."""
    snap = current_snapshot()
    base = pre_parse_base(argv)
    if snap is None or base not in snap["train_flags"]:
        return
    line = unknown_flags_line(argv, snap["train_flags"][base])
    if line:
        raise HfAttnInputError(line)


def build_snapshot() -> dict:
    """The snapshot's contents, from the registry and the training parser (imports torch and transformers)."""
    from .presets_text import presets_texts
    from .train_args import build_train_parser

    flags = {b: sorted(build_train_parser(["--base", b])._option_string_actions) for b in BASES}
    return {"key": key(), "transformers": transformers_version(), **presets_texts(), "train_flags": flags}


def write_snapshot(path: Path = SNAPSHOT) -> bool:
    """Write the snapshot; True when the file changed."""
    text = json.dumps(build_snapshot(), indent=1, ensure_ascii=False) + "\n"
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True
