"""Reference figures measured with hf-attn, printed beside a run's score when the run matches: same data, same
default model size and training setup, same number of steps (the main job's default budget is a step count, so
the figure holds on any machine up to float rounding: about +-0.5 BLEU between 1 and 2 torch threads).

Key: (corpus, source translation code, target translation code, training steps). Value: the `softmax` preset's
scores on the test split (John, 879 verses), beam 4, sacrebleu defaults, and the training setup they hold for
(a run with another learning rate, batch, warm-up, embedding scale or init gets no reference).
"""

REFERENCES: dict[tuple, dict] = {
    # hf-attn train --preset softmax --output_dir runs/softmax-600 (default flags), measured 2026-11-23
    ("bible", "e", "4", 600): {
        "bleu": 13.9, "chrf": 30.3, "steps": 600, "device": "a 2-core x86_64 CPU", "test_sentences": 879,
        "validation_loss": 4.6025,
        "training": {"learning_rate": 0.001, "warmup_steps": 300, "per_device_train_batch_size": 64,
                     "gradient_accumulation_steps": 1, "label_smoothing_factor": 0.1, "world_size": 1,
                     "embedding_init_std": 0.0625},
        "model_config": {"scale_embedding": True, "dropout": 0.1, "vocab_size": 8002, "init_std": 0.02},
    },
}


def reference_for(run: dict) -> dict | None:
    data = run.get("data", {})
    if run.get("minutes") or not run.get("default_model_size") or run.get("init_from"):
        return None
    key = (data.get("corpus"), data.get("source_code"), data.get("target_code"), run.get("train_steps"))
    ref = REFERENCES.get(key)
    if ref is None or run.get("test_sentences") != ref.get("test_sentences"):
        return None
    for group in ("training", "model_config"):
        for k, v in ref.get(group, {}).items():
            if (run.get(group) or {}).get(k) != v:
                return None
    return ref
