"""``hf-attn presets [--verbose]``: list the attention presets (and every variant's hyperparameters)."""

from __future__ import annotations

import argparse

from ..modeling import ATTENTION_VARIANTS, PRESETS
from ..modeling.citations import cited
from ..modeling.hyperparameters import did_you_mean

def run(argv) -> int:
    ap = argparse.ArgumentParser(prog="hf-attn presets", description="list the attention presets")
    ap.add_argument("--verbose", "-v", action="store_true",
                    help="also each preset's settings and papers (with their pages), and every variant's "
                         "hyperparameters (type, default, valid values, help, paper symbol): the `hf-attn train` "
                         "flags")
    ap.add_argument("--bibtex", metavar="PRESET",
                    help="print the BibTeX entries of the papers a preset implements or compares with, and exit")
    a = ap.parse_args(argv)
    if a.bibtex is not None:
        if a.bibtex not in PRESETS:
            ap.error(f"--bibtex: no preset {a.bibtex!r}{did_you_mean(a.bibtex, PRESETS)}; `hf-attn presets` lists them")
        print("\n\n".join(c.bibtex for c in cited(PRESETS[a.bibtex].paper)))
        return 0
    width = max(len(n) for n in PRESETS)
    for name, p in PRESETS.items():
        print(f"{name:<{width}}  {p.description}")
        if a.verbose:
            settings = ", ".join(f"{k}={v!r}" for k, v in p.overrides.items())
            print(f"{'':<{width}}    {settings}")
            for i, c in enumerate(cited(p.paper)):  # the paper, then the one comparing with a baseline
                print(f"{'':<{width}}    {'as compared in ' if i else ''}{c}: {c.url or '(no public page)'}")
    if a.verbose:
        print(describe_variants())
    return 0


def describe_variants() -> str:
    """Every attention variant: sites, description and its hyperparameters (the `hf-attn train` flags)."""
    lines = ["", "variants and their hyperparameters (flags of `hf-attn train`: --NAME VALUE):"]
    for name, cls in ATTENTION_VARIANTS.items():
        lines += ["", f"{name} (sites: {', '.join(cls.sites)}): {cls.description}"]
        for hp in cls.hyperparameters:
            lines.append(f"  --{hp.name} {hp.type_name()}: {hp.valid_values()}; default {hp.initial()!r}")
            lines.append(f"      {hp.help}")
            if hp.symbol:
                lines.append(f"      paper symbol: {hp.symbol}")
        if not cls.hyperparameters:
            lines.append("  (no hyperparameters)")
    return "\n".join(lines)
