"""``hf-attn presets [--verbose] [--bibtex PRESET]``: list the attention presets (and every variant's
hyperparameters). The text comes from `snapshot` when it matches the code, else from the registry
(`presets_text`)."""

from __future__ import annotations

from ..errors import HfAttnInputError
from .flags import OneLineParser
from .snapshot import current_snapshot


def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn presets", description="list the attention presets")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="also each preset's settings and papers (with their pages), and every variant's "
                         "hyperparameters (type, default, valid values, help, paper symbol): the `hf-attn train` "
                         "flags")
    ap.add_argument("--bibtex", metavar="PRESET",
                    help="print the BibTeX entries of the papers a preset implements or compares with, and exit")
    a = ap.parse_args(argv)
    if (texts := current_snapshot()) is None:  # the code differs from the snapshot's: from the registry
        from .presets_text import presets_texts

        texts = presets_texts()
    if a.bibtex is not None:
        if a.bibtex not in texts["bibtex"]:
            from ..modeling.hyperparameters import did_you_mean  # (loads the model code: an error path)

            raise HfAttnInputError(f"--bibtex: no preset {a.bibtex!r}{did_you_mean(a.bibtex, texts['bibtex'])}; "
                                   "`hf-attn presets` lists them")
        print(texts["bibtex"][a.bibtex])
        return 0
    print(texts["verbose" if a.verbose else "list"])
    return 0

