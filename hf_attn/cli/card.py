"""``hf-attn card DIR``: write the hf-attn model card of a model directory."""

from __future__ import annotations

import json
import os

from ..errors import HfAttnInputError
from ..modeling import HfAttnBartConfig, HfAttnMarianConfig
from ..rundir import check_model_files
from ..training.cards import write_model_card
from ..training.hub import check_repo_id
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn card", description="write the hf-attn model card (README.md) of a model "
                       "directory; a card transformers' Trainer wrote there is kept as its training section")
    ap.add_argument("model_dir")
    ap.add_argument("--repo_id", "--repo-id", default=None, help="the Hub repo the card names (default: the directory)")
    a = ap.parse_args(argv)
    if a.repo_id:
        check_repo_id(a.repo_id, "--repo_id")
    check_model_files(a.model_dir)
    check_hf_attn_model(a.model_dir)
    print(f"wrote {write_model_card(a.model_dir, a.repo_id)}")
    return 0


def check_hf_attn_model(model_dir: str) -> None:
    """One line when ``model_dir`` holds a model without hf-attn attention (a stock Marian/BART checkpoint)."""
    config = os.path.join(model_dir, "config.json")
    try:
        data = json.loads(open(config, encoding="utf-8").read())
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"{config!r} cannot be read as JSON ({e}); give a directory written by `hf-attn train`, "
                               "`hf-attn convert` or save_pretrained") from None
    if not isinstance(data, dict):
        raise HfAttnInputError(f"{config!r} holds a JSON {type(data).__name__}, not a model config (a JSON object); "
                               "give a directory written by `hf-attn train`, `hf-attn convert` or save_pretrained")
    model_type = data.get("model_type")
    if model_type not in (HfAttnMarianConfig.model_type, HfAttnBartConfig.model_type):
        raise HfAttnInputError(f"{model_dir!r} holds a {model_type or 'non-hf-attn'} model, without hf-attn attention: an "
                               "hf-attn card describes a variant; convert it first: `hf-attn convert "
                               f"{model_dir} OUTPUT_DIR --preset rela-g` (or the preset you want)")
