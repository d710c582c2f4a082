"""The flag names on an ``hf-attn train`` command line, and the one line for those the command does not have; and
`OneLineParser`, the parser of the other commands, whose errors are that one line too.

Light on purpose (no torch, no transformers): `snapshot` answers ``hf-attn train --no_such_flag`` with it before the
parser's modules load, and `train_args` gives the same line after they have.
"""

from __future__ import annotations

import argparse
import difflib

from ..errors import HfAttnInputError


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser for the commands other than ``train`` (whose parser is transformers'): a flag it cannot
    parse (a word for a number, a choice it lacks, a missing argument) is the CLI's one line, ``hf-attn: error: ...``
    and exit code 2 (cli/__init__.py prints it), instead of the usage block and argparse's own error line."""

    def error(self, message: str):
        raise HfAttnInputError(f"{' '.join(message.split())}; `{self.prog} --help` lists the arguments")


def pre_parse_base(argv: list[str]) -> str:
    """The ``--base`` value on the command line (``marian`` when absent): the parser's model flags depend on it."""
    for i, a in enumerate(argv):
        if a == "--base" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--base="):
            return a.split("=", 1)[1]
    return "marian"


def unknown_flags_line(argv: list[str], options) -> str | None:
    """One error line naming each ``--flag`` of ``argv`` that no option of the parser (``options``: its option
    strings) has, with the closest flag and where the list is; None when every flag is known. A flag that starts an
    option's name is known: argparse takes unique abbreviations (an ambiguous one is argparse's own line)."""
    options = sorted(o for o in options if o.startswith("--"))
    unknown = []
    for a in argv:
        if not a.startswith("--") or a == "--":
            continue
        flag = a.split("=", 1)[0]
        if not any(o.startswith(flag) for o in options) and flag not in unknown:
            unknown.append(flag)
    if not unknown:
        return None
    names = sorted({o[2:].replace("-", "_") for o in options})
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag[2:].replace("-", "_"), names, n=1)
        hints.append(f"{flag} (did you mean --{close[0]}?)" if close else flag)
    noun = "flag" if len(unknown) == 1 else "flags"
    return f"hf-attn train has no {noun} {', '.join(hints)}; `hf-attn train --help` lists every flag"
