"""``hf-attn convert SOURCE OUTPUT_DIR`` (or ``--output_dir OUTPUT_DIR``, as every other command and transformers'
scripts spell it): a Marian/BART checkpoint with a preset's attention, as a complete model directory."""

from __future__ import annotations

from ..errors import HfAttnInputError
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn convert", description="swap a preset's attention into a Marian/BART "
                       "checkpoint and save a complete model directory (model, code, tokenizer, card)")
    ap.add_argument("source", help="a Marian/BART (or hf-attn) model directory or Hub id")
    ap.add_argument("output_dir", nargs="?", default=None, help="a new or empty directory (or give --output_dir)")
    ap.add_argument("--output_dir", "--output-dir", dest="output_dir_flag", metavar="OUTPUT_DIR", default=None,
                    help="the same as the positional OUTPUT_DIR")
    ap.add_argument("--preset", default="rela-g", help="the attention preset (`hf-attn presets`; default rela-g)")
    ap.add_argument("--tokenizer", default=None, help="take the tokenizer from here (default: SOURCE)")
    a = ap.parse_args(argv)
    output_dir = output_directory(a.output_dir, a.output_dir_flag)
    if not a.source.strip():  # '' would be the current directory
        raise HfAttnInputError("SOURCE is an empty string; give a Marian/BART model directory or Hub id, e.g. "
                               "Helsinki-NLP/opus-mt-de-en")
    from ..training.convert import convert_checkpoint  # torch and transformers: after the flags are checked

    out = convert_checkpoint(a.source, output_dir, a.preset, tokenizer=a.tokenizer)
    print(f"converted {a.source} to {a.preset}: {out}")
    return 0


def output_directory(positional: str | None, flag: str | None) -> str:
    """OUTPUT_DIR from the positional argument or ``--output_dir``: one of them, or both naming the same directory."""
    if positional is None and flag is None:
        raise HfAttnInputError("no output directory; give it after SOURCE or as --output_dir DIR, e.g. "
                               "`hf-attn convert Helsinki-NLP/opus-mt-de-en --output_dir runs/rela-g`")
    if positional is not None and flag is not None and positional != flag:
        raise HfAttnInputError(f"two output directories, {positional!r} and --output_dir {flag!r}; give one")
    out = positional if positional is not None else flag
    if not out.strip():  # an empty shell variable: not the current directory
        raise HfAttnInputError("the output directory is an empty string; give a directory name, e.g. runs/rela-g")
    return out
