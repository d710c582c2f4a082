"""SacreBLEU as an `evaluate` metric, loadable offline by path (one import per line: evaluate scans them)."""

import datasets
import evaluate
import sacrebleu

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

    def _compute(self, predictions, references, smooth_method="exp", smooth_value=None, force=False,
                 lowercase=False, tokenize=None, use_effective_order=False):
        if references and isinstance(references[0], str):
            references = [[r] for r in references]
        n_refs = len(references[0])
        if any(len(r) != n_refs for r in references):
            raise ValueError("sacrebleu needs the same number of references for each prediction")
        transposed = [[refs[i] for refs in references] for i in range(n_refs)]
        bleu = sacrebleu.metrics.BLEU(lowercase=lowercase, force=force, tokenize=tokenize,
                                      smooth_method=smooth_method, smooth_value=smooth_value,
                                      effective_order=use_effective_order)
        out = bleu.corpus_score(predictions, transposed)
        return {"score": out.score, "counts": out.counts, "totals": out.totals, "precisions": out.precisions,
                "bp": out.bp, "sys_len": out.sys_len, "ref_len": out.ref_len, "signature": str(bleu.get_signature())}
