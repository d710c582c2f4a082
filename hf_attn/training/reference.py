"""Reference figures measured with hf-attn on this project's CI-class machine (2 CPU cores), printed beside a
run's score when the run matches (same data, same time budget, default model size).

Key: (corpus, source translation code, target translation code, minutes). Value: the `softmax` preset's
scores on the test split (John), beam 4, sacrebleu defaults.
"""

REFERENCES: dict[tuple, dict] = {
    # filled in from `hf-attn train --preset softmax` (12 minutes, defaults); see README "Results"
}


def reference_for(run: dict) -> dict | None:
    data = run.get("data", {})
    key = (data.get("corpus"), data.get("source_code"), data.get("target_code"), run.get("minutes"))
    ref = REFERENCES.get(key)
    if ref is None or not run.get("default_model_size"):
        return None
    return ref
