"""The `hf-attn train` flags that choose a run's data, declared below both sides of `hf-attn reproduce`: the runs
train with them (`training/args.py`: `HfAttnArguments` has one field of this type per flag), and the report reads a
record's test split from its command line with them (`report.records.data_arguments`) without importing training."""

from __future__ import annotations

# flag name -> its type; a flag not given is None (no data flag at all: the Bible, German -> English). `load_corpus`
# takes all but the last; the last limits the test split.
DATA_ARGUMENTS = {"source": str, "target": str, "corpus": str, "train_file": str, "validation_file": str,
                  "test_file": str, "dataset": str, "dataset_config_name": str, "max_predict_samples": int}
