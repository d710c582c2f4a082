"""The generated tables of docs/api.md: the hf-attn configuration fields and every variant's hyperparameters (name,
type, default, valid values, the paper's symbol, description), written from their declarations (the config mixin's
dataclass fields; each variant's `Hyperparameter` entries, which the `hf-attn train` flags come from too).

`python scripts/write_api_tables.py` rewrites the block between `START` and `END` of docs/api.md; tests/test_api_docs.py
fails while it differs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import HfAttnInputError
from ..io_utils import with_marked_block
from ..modeling.configuration_hf_attn import HfAttnConfigMixin
from ..modeling.hyperparameters import SITES, Hyperparameter
from ..modeling.registry import ATTENTION_VARIANTS
from .rewrite import write_changed

COMMAND = "python scripts/write_api_tables.py"
API_PAGE = "docs/api.md"  # under the repository root
START, END = "<!-- api-tables:start -->", "<!-- api-tables:end -->"


def _site_variants(site: str) -> str:
    return ", ".join(f"`{v}`" for v, cls in ATTENTION_VARIANTS.items() if site in cls.sites)


def field_valid_values() -> dict[str, str]:
    """The valid values of each field of `HfAttnConfigMixin`, in words (the variants from the registry)."""
    out = {}
    for site in SITES:
        out[f"{site}_attention"] = (f"a variant allowed at this site ({_site_variants(site)}), or a list with one "
                                    "such name per layer")
        out[f"{site}_attention_layers"] = ("None (every layer, or the variant's own subset), or a list of layer "
                                           "indices 0..layers-1 that use the site's single variant (softmax "
                                           "elsewhere)")
    out["preset"] = "None, or the name of the preset the config was built from (`from_preset` sets it)"
    out["attention_kernels"] = ("auto (the fused Triton kernels on CUDA where triton is installed), triton (always; "
                                "the CPU only under TRITON_INTERPRET=1), eager (the written-out torch path); the "
                                "environment variable HF_ATTN_KERNELS overrides it (docs/speed.md, 'On a GPU')")
    return out


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def config_table() -> str:
    valid = field_valid_values()
    rows = ["| field | type | default | valid values |", "|---|---|---|---|"]
    for f in dataclasses.fields(HfAttnConfigMixin):
        if f.name not in valid:
            raise HfAttnInputError(f"config field {f.name!r} has no valid-values text in "
                                   "hf_attn/docgen/api_tables.py: field_valid_values")
        rows.append(f"| `{f.name}` | {_cell(f.type)} | `{f.default!r}` | {_cell(valid[f.name])} |")
    return "\n".join(rows)


def hyperparameter_row(hp: Hyperparameter) -> str:
    symbol = _cell(hp.symbol) if hp.symbol else "(none: not in the paper)"
    return (f"| `{hp.name}` | {_cell(hp.type_name())} | `{hp.initial()!r}` | {_cell(hp.valid_values())} | {symbol} | "
            f"{_cell(hp.help)} |")


def variant_tables() -> str:
    parts = []
    for name, cls in ATTENTION_VARIANTS.items():
        description = cls.description[:1].upper() + cls.description[1:]
        parts.append(f"#### `{name}`\n\n{description}. Sites: {', '.join(cls.sites)}.\n")
        if not cls.hyperparameters:
            parts.append("No hyperparameters.\n")
            continue
        rows = ["| name | type | default | valid values | paper symbol | description |", "|---|---|---|---|---|---|"]
        parts.append("\n".join(rows + [hyperparameter_row(hp) for hp in cls.hyperparameters]) + "\n")
    return "\n".join(parts)


def api_block() -> str:
    return (f"### Configuration fields\n\n{config_table()}\n\n### Variant hyperparameters\n\n"
            "Flat fields of both configurations, and `hf-attn train` flags (`--NAME VALUE`):\n\n"
            f"{variant_tables()}")


def api_docs(root: Path) -> dict[Path, str]:
    """docs/api.md under the repository ``root`` -> its text with the generated block rewritten."""
    path = Path(root) / API_PAGE
    text = with_marked_block(path.read_text(encoding="utf-8"), START, END, api_block())
    if text is None:
        raise HfAttnInputError(f"{path}: no block between {START} and {END}; add the two marker lines where the "
                               "tables belong")
    return {path: text}


def write_api_tables(root: Path) -> list[Path]:
    """Rewrite the generated block of docs/api.md under ``root``; the files that changed."""
    return write_changed(api_docs(root))
