"""What the two `evaluate` metric modules share: their `MetricInfo` and the reference layout sacrebleu wants."""

from __future__ import annotations


def metric_info(description: str, citation: str, inputs_description: str):
    """`evaluate.MetricInfo` for string predictions against one reference string or a list of them each."""
    import datasets
    import evaluate

    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs_description,
        features=[
            datasets.Features({"predictions": datasets.Value("string"),
                               "references": datasets.Sequence(datasets.Value("string"))}),
            datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
        ],
        reference_urls=["https://github.com/mjpost/sacrebleu"],
    )


def reference_streams(references: list, metric: str) -> list[list[str]]:
    """Per-prediction references (a string or a list each) -> sacrebleu's reference streams (one list per position)."""
    if references and isinstance(references[0], str):
        references = [[r] for r in references]
    n_refs = len(references[0])
    if any(len(r) != n_refs for r in references):
        raise ValueError(f"{metric} needs the same number of references for each prediction")
    return [[refs[i] for refs in references] for i in range(n_refs)]
