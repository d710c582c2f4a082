"""What ``hf-attn presets`` prints, from the registry: the preset list, ``--verbose``'s settings, papers and every
variant's hyperparameters, and ``--bibtex PRESET``'s entries. `snapshot` keeps a copy, so that the command answers
without importing the model code."""

from __future__ import annotations

from ..modeling import ATTENTION_VARIANTS, PRESETS
from ..modeling.citations import cited


def preset_list(verbose: bool) -> str:
    """One line per preset; with ``verbose``, its settings and papers (with their pages), then `describe_variants`."""
    width = max(len(n) for n in PRESETS)
    lines = []
    for name, p in PRESETS.items():
        lines.append(f"{name:<{width}}  {p.description}")
        if verbose:
            settings = ", ".join(f"{k}={v!r}" for k, v in p.overrides.items())
            lines.append(f"{'':<{width}}    {settings}")
            for i, c in enumerate(cited(p.paper)):  # the paper, then the one comparing with a baseline
                lines.append(f"{'':<{width}}    {'as compared in ' if i else ''}{c}: {c.url or '(no public page)'}")
    if verbose:
        lines.append(describe_variants())
    return "\n".join(lines)


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


def bibtex() -> dict[str, str]:
    """Preset -> the BibTeX entries of the papers it implements or compares with."""
    return {name: "\n\n".join(c.bibtex for c in cited(p.paper)) for name, p in PRESETS.items()}


def presets_texts() -> dict:
    """The command's texts: the list, the ``--verbose`` list and each preset's BibTeX (what `snapshot` keeps)."""
    return {"list": preset_list(False), "verbose": preset_list(True), "bibtex": bibtex()}
