"""``hf-attn evaluate DIR``: re-score a saved model (BLEU/chrF, sacrebleu)."""

from __future__ import annotations

from ..io_utils import dumps_strict
from ..rundir import SPLITS
from ..training.run import evaluate_dir
from ..training.validate import DECODE_FLAGS, check_flags
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn evaluate", description="re-score a saved model (BLEU/chrF, sacrebleu)")
    ap.add_argument("model_dir")
    ap.add_argument("--split", default="test", choices=SPLITS)
    ap.add_argument("--test_file", "--test-file", default=None, help="score on this file instead (.jsonl/.tsv)")
    ap.add_argument("--source", default=None)
    ap.add_argument("--target", default=None)
    ap.add_argument("--num_beams", "--num-beams", "--beam", type=int, default=None)
    ap.add_argument("--length_penalty", "--length-penalty", type=float, default=None)
    ap.add_argument("--batch_size", "--batch-size", type=int, default=32)
    ap.add_argument("--max_samples", "--max-samples", type=int, default=None)
    a = ap.parse_args(argv)
    check_flags(DECODE_FLAGS, a)
    out = evaluate_dir(a.model_dir, a.split, a.test_file, a.source, a.target, a.num_beams, a.length_penalty,
                       a.batch_size, a.max_samples)
    print(f"BLEU {out['bleu']:.2f} / chrF {out['chrf']:.2f} on {out['sentences']} sentences ({out['data']}), "
          f"beam {out['num_beams']} | {out['bleu_signature']}")
    print(dumps_strict(out))
    return 0
