"""The softmax reference a run's summary line and card quote (hf_attn/training/reference.py): taken only from a
complete `hf-attn reproduce` record with the run's own settings."""

from __future__ import annotations

def test_softmax_reference_comes_from_a_matching_reproduce_record(monkeypatch, tmp_path):
    import json

    from hf_attn.training import reference
    from hf_attn.training.record import summary_line

    common = {"test_sentences": 879, "train_steps": 300, "minutes": None, "default_model_size": True, "init_from": None,
              "data": {"corpus": "bible", "source_code": "e", "target_code": "4"},
              "training": {"learning_rate": 1e-3, "warmup_steps": 300, "embedding_init_std": 0.0625, "seed": 42},
              "model_config": {"scale_embedding": True, "activation_function": "relu"}}
    record = {"name": "de-en_300steps_seed42_softmax", "status": "complete",
              "results": {**common, "preset": "softmax", "bleu": 5.0, "chrf": 20.0, "device": "2-core CPU"}}
    (tmp_path / "de-en_300steps_seed42_softmax.json").write_text(json.dumps(record))
    (tmp_path / "failed.json").write_text(json.dumps({**record, "status": "failed"}))
    monkeypatch.setattr(reference, "RECORD_DIRS", [tmp_path])
    run = {**common, "preset": "rela-g", "bleu": 6.0, "chrf": 21.0, "source_lang": "de", "target_lang": "en",
           "num_beams": 4, "train_minutes": 14.0, "tokens_per_second": 900, "bleu_signature": "sig"}
    ref = reference.reference_for(run)
    assert ref == {"bleu": 5.0, "chrf": 20.0, "steps": 300, "device": "2-core CPU", "seed": 42,
                   "record": "de-en_300steps_seed42_softmax"}
    run["reference"] = ref
    assert "| softmax reference: BLEU 5.0 / chrF 20.0 (300 steps on 2-core CPU) |" in summary_line(run)
    for change in ({"train_steps": 299}, {"minutes": 15.0}, {"default_model_size": False}, {"test_sentences": 100},
                   {"training": {**common["training"], "learning_rate": 5e-4}},
                   {"model_config": {"scale_embedding": False, "activation_function": "relu"}},
                   {"model_config": {"scale_embedding": True, "activation_function": "swish"}},
                   {"training": {**common["training"], "embedding_init_std": 0.02}},
                   {"data": {"corpus": "bible", "source_code": "s", "target_code": "4"}}):
        assert reference.reference_for({**run, **change}) is None, change
