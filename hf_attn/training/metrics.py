"""BLEU and chrF with sacrebleu on detokenized text (never `evaluate.load("sacrebleu")`, which needs the Hub)."""

from __future__ import annotations

import numpy as np
import sacrebleu


def score_translations(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus BLEU and chrF (sacrebleu defaults: 13a tokenisation, exp smoothing; chrF n=6 beta=2) + signatures."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must pair up")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(float(b.score), 2),
        "chrf": round(float(c.score), 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_details": {"precisions": [round(p, 2) for p in b.precisions], "bp": round(b.bp, 4),
                         "sys_len": b.sys_len, "ref_len": b.ref_len},
        "sentences": len(hypotheses),
    }


class Seq2SeqMetrics:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: decodes predictions and labels
    (-100 -> pad), returns ``bleu``, ``chrf`` and ``gen_len``; the last signatures stay in ``self.signatures``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.signatures: dict[str, str] = {}

    def __call__(self, eval_preds) -> dict:
        preds, labels = eval_preds.predictions, eval_preds.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        pad = self.tokenizer.pad_token_id
        preds = np.where(preds < 0, pad, preds)
        labels = np.where(labels < 0, pad, labels)
        hyps = [t.strip() for t in self.tokenizer.batch_decode(preds, skip_special_tokens=True)]
        refs = [t.strip() for t in self.tokenizer.batch_decode(labels, skip_special_tokens=True)]
        s = score_translations(hyps, refs)
        self.signatures = {"bleu": s["bleu_signature"], "chrf": s["chrf_signature"]}
        gen_len = float(np.mean([np.count_nonzero(p != pad) for p in preds])) if len(preds) else 0.0
        return {"bleu": s["bleu"], "chrf": s["chrf"], "gen_len": round(gen_len, 2)}
