"""``hf-attn translate DIR``: translate stdin or a file, one sentence per line."""

from __future__ import annotations

import os
import sys

from ..errors import HfAttnInputError
from ..generation import decoding_settings, translate_texts
from ..io_utils import check_output_file, decode_utf8, read_text, text_lines
from ..rundir import check_model_files, load_model_dir, run_arg
from ..training.validate import DECODE_FLAGS, check_flags
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn translate", description="translate stdin or a file, one sentence per line")
    ap.add_argument("model_dir")
    ap.add_argument("--input", "-i", default=None, help="input file (default: stdin)")
    ap.add_argument("--output", "-o", default=None, help="output file (default: stdout)")
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None)
    ap.add_argument("--length_penalty", "--length-penalty", type=float, default=None)
    ap.add_argument("--batch_size", "--batch-size", type=int, default=32)
    a = ap.parse_args(argv)
    check_flags(DECODE_FLAGS, a)
    if a.input and not os.path.isfile(a.input):
        raise HfAttnInputError(f"--input {a.input!r}: no such file; give a text file with one sentence per line")
    if a.output:
        check_output_file(a.output, "--output")
    check_model_files(a.model_dir)  # before reading stdin
    if a.input:
        text = read_text(a.input, f"--input {a.input!r}")
    else:
        stdin = getattr(sys.stdin, "buffer", None)
        text = decode_utf8(stdin.read(), "stdin") if stdin is not None else sys.stdin.read()
    lines = text_lines(text)
    model, tokenizer = load_model_dir(a.model_dir)
    beams, lp = decoding_settings(model, a.num_beams, a.length_penalty)
    hyps = translate_texts(model, tokenizer, lines, num_beams=beams, length_penalty=lp, batch_size=a.batch_size,
                           progress=len(lines) > 64, max_source_length=run_arg(a.model_dir, "max_source_length", 256))
    text = "\n".join(hyps) + ("\n" if hyps else "")
    if a.output:
        with open(a.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0
