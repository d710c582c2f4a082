"""SacreBLEU as an `evaluate` metric, loadable offline by path (one import per line: evaluate scans them)."""

import evaluate
import sacrebleu

import hf_attn.metrics.common as common

_DESCRIPTION = "Corpus BLEU computed by sacrebleu (13a tokenisation, exp smoothing by default), with its signature."
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings (detokenized).
    references: list of lists of reference strings (one list per prediction, same number of references each).
    tokenize, smooth_method, smooth_value, lowercase, force, use_effective_order: as sacrebleu.BLEU.
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len, signature.
"""
_CITATION = "Post, 2018. A Call for Clarity in Reporting BLEU Scores. WMT."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class HfAttnSacrebleu(evaluate.Metric):
    def _info(self):
        return common.metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions, references, smooth_method="exp", smooth_value=None, force=False,
                 lowercase=False, tokenize=None, use_effective_order=False):
        transposed = common.reference_streams(references, "sacrebleu")
        bleu = sacrebleu.metrics.BLEU(lowercase=lowercase, force=force, tokenize=tokenize,
                                      smooth_method=smooth_method, smooth_value=smooth_value,
                                      effective_order=use_effective_order)
        out = bleu.corpus_score(predictions, transposed)
        return {"score": out.score, "counts": out.counts, "totals": out.totals, "precisions": out.precisions,
                "bp": out.bp, "sys_len": out.sys_len, "ref_len": out.ref_len, "signature": str(bleu.get_signature())}
