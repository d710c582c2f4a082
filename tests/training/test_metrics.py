"""The metrics: BLEU and chrF with their sacrebleu signatures, the trainer's `compute_metrics`, and the shipped
`evaluate` modules loaded offline."""

from __future__ import annotations

import math

import pytest

from hf_attn.training import Seq2SeqMetrics, score_translations


def test_scores_and_signature():
    refs = ["The cat sat on the mat.", "In the beginning God created the heavens and the earth."]
    s = score_translations(refs, refs)
    assert s["bleu"] == 100.0 and s["chrf"] == 100.0
    assert s["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "nc:6|nw:0" in s["chrf_signature"]
    low = score_translations(["a dog", "nothing here"], refs)
    assert 0 <= low["bleu"] < 10 and low["chrf"] < 30
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        score_translations(refs, refs[:1])


def test_compute_metrics_decodes_with_ignored_labels():
    from types import SimpleNamespace

    import numpy as np

    class DecTok:
        pad_token_id = 0
        words = {1: "the", 2: "cat", 3: "sat", 4: "on", 5: "a", 6: "mat"}

        def batch_decode(self, rows, skip_special_tokens=True):
            return [" ".join(self.words[int(i)] for i in r if int(i) in self.words) for r in rows]

    m = Seq2SeqMetrics(DecTok())
    preds = np.array([[1, 2, 3, 4, 5, 6, 0], [1, 2, 3, 4, 1, 0, 0]])
    labels = np.array([[1, 2, 3, 4, 5, 6, -100], [1, 2, 3, 4, 1, -100, -100]])
    out = m(SimpleNamespace(predictions=preds, label_ids=labels))
    assert out["bleu"] == 100.0 and out["gen_len"] == 5.5 and m.signatures["bleu"].startswith("nrefs:1")


def test_evaluate_metric_modules_load_offline():
    from hf_attn.metrics import load_metric

    bleu = load_metric("sacrebleu")
    r = bleu.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on a mat"]])
    direct = score_translations(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert math.isclose(r["score"], direct["bleu"], abs_tol=0.01) and r["signature"] == direct["bleu_signature"]
    chrf = load_metric("chrf")
    r = chrf.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on a mat"]])
    assert math.isclose(r["score"], direct["chrf"], abs_tol=0.01)
