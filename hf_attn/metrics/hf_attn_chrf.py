"""chrF / chrF++ (sacrebleu) as an `evaluate` metric, loadable offline by path (one import per line)."""

import datasets
import evaluate
import sacrebleu

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
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": datasets.Value("string"),
                                   "references": datasets.Sequence(datasets.Value("string"))}),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(self, predictions, references, char_order=6, word_order=0, beta=2, lowercase=False,
                 whitespace=False, eps_smoothing=False):
        if references and isinstance(references[0], str):
            references = [[r] for r in references]
        n_refs = len(references[0])
        if any(len(r) != n_refs for r in references):
            raise ValueError("chrF needs the same number of references for each prediction")
        transposed = [[refs[i] for refs in references] for i in range(n_refs)]
        chrf = sacrebleu.metrics.CHRF(char_order=char_order, word_order=word_order, beta=beta, lowercase=lowercase,
                                      whitespace=whitespace, eps_smoothing=eps_smoothing)
        out = chrf.corpus_score(predictions, transposed)
        return {"score": out.score, "char_order": char_order, "word_order": word_order, "beta": beta,
                "signature": str(chrf.get_signature())}
