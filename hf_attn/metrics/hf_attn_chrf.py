"""chrF / chrF++ (sacrebleu) as an `evaluate` metric, loadable offline by path (one import per line)."""

import evaluate
import sacrebleu

import hf_attn.metrics.common as common

_DESCRIPTION = "Corpus chrF computed by sacrebleu (char order 6, beta 2; word_order=2 gives chrF++), with its signature."
_KWARGS_DESCRIPTION = """
Args:
    predictions: list of hypothesis strings (detokenized).
    references: list of lists of reference strings (one list per prediction, same number of references each).
    char_order, word_order, beta, lowercase, whitespace, eps_smoothing: as sacrebleu.CHRF.
Returns:
    score, char_order, word_order, beta, signature.
"""
_CITATION = "Popovic, 2015. chrF: character n-gram F-score for automatic MT evaluation. WMT."


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class HfAttnChrf(evaluate.Metric):
    def _info(self):
        return common.metric_info(_DESCRIPTION, _CITATION, _KWARGS_DESCRIPTION)

    def _compute(self, predictions, references, char_order=6, word_order=0, beta=2, lowercase=False,
                 whitespace=False, eps_smoothing=False):
        transposed = common.reference_streams(references, "chrF")
        chrf = sacrebleu.metrics.CHRF(char_order=char_order, word_order=word_order, beta=beta, lowercase=lowercase,
                                      whitespace=whitespace, eps_smoothing=eps_smoothing)
        out = chrf.corpus_score(predictions, transposed)
        return {"score": out.score, "char_order": char_order, "word_order": word_order, "beta": beta,
                "signature": str(chrf.get_signature())}
