"""The essential path of transformers' examples/pytorch/translation/run_translation.py (not shipped with the pip
package, so not available offline), rewritten with the same flags and the same calls in the same order: the
documentation's `run_translation.py` command runs here unchanged (tests/test_example_scripts.py). Left out: mBART/M2M
language codes, T5 prefixes, --pad_to_max_length, telemetry, checkpoint detection, --dataset_name."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import evaluate
import numpy as np
from datasets import load_dataset
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)


@dataclass
class ModelArguments:
    model_name_or_path: str
    cache_dir: str | None = None
    trust_remote_code: bool = False


@dataclass
class DataTrainingArguments:
    source_lang: str
    target_lang: str
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    max_source_length: int = 1024
    max_target_length: int = 128
    val_max_target_length: int | None = None
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_predict_samples: int | None = None
    num_beams: int = 1
    ignore_pad_token_for_loss: bool = True

    def __post_init__(self):
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)

    files = {k: v for k, v in (("train", data_args.train_file), ("validation", data_args.validation_file),
                               ("test", data_args.test_file)) if v}
    raw = load_dataset("json", data_files=files, cache_dir=model_args.cache_dir)

    kw = dict(cache_dir=model_args.cache_dir, trust_remote_code=model_args.trust_remote_code)
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, **kw)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, **kw)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config, **kw)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    if model.config.decoder_start_token_id is None:
        raise ValueError("Make sure that `config.decoder_start_token_id` is correctly defined")
    if model.config.max_position_embeddings < data_args.max_source_length:
        raise ValueError(f"`--max_source_length` is set to {data_args.max_source_length}, but the model only has "
                         f"{model.config.max_position_embeddings} position encodings.")
    if training_args.label_smoothing_factor > 0 and not hasattr(model, "prepare_decoder_input_ids_from_labels"):
        print("label smoothing without prepare_decoder_input_ids_from_labels", file=sys.stderr)

    src, tgt = data_args.source_lang.split("_")[0], data_args.target_lang.split("_")[0]
    max_target_length = data_args.max_target_length

    def preprocess_function(examples):
        inputs = [ex[src] for ex in examples["translation"]]
        targets = [ex[tgt] for ex in examples["translation"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_source_length, padding=False, truncation=True)
        labels = tokenizer(text_target=targets, max_length=max_target_length, padding=False, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    def prepare(split, limit):
        ds = raw[split]
        if limit is not None:
            ds = ds.select(range(min(len(ds), limit)))
        return ds.map(preprocess_function, batched=True, remove_columns=ds.column_names)

    train_dataset = prepare("train", data_args.max_train_samples) if training_args.do_train else None
    max_target_length = data_args.val_max_target_length
    eval_dataset = prepare("validation", data_args.max_eval_samples) if training_args.do_eval else None
    predict_dataset = prepare("test", data_args.max_predict_samples) if training_args.do_predict else None

    label_pad_token_id = -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id
    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=label_pad_token_id,
                                           pad_to_multiple_of=8 if training_args.fp16 else None)

    metric = evaluate.load("sacrebleu", cache_dir=model_args.cache_dir)  # by name, as the example does

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        decoded_preds = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_labels = [[t.strip()] for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = {"bleu": metric.compute(predictions=decoded_preds, references=decoded_labels)["score"]}
        result["gen_len"] = np.mean([np.count_nonzero(p != tokenizer.pad_token_id) for p in preds])
        return {k: round(v, 4) for k, v in result.items()}

    trainer = Seq2SeqTrainer(
        model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
        processing_class=tokenizer, data_collator=data_collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
    )
    if training_args.do_train:
        result = trainer.train()
        trainer.save_model()  # the model and the tokenizer
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()
    max_length = training_args.generation_max_length or data_args.val_max_target_length
    num_beams = data_args.num_beams if data_args.num_beams is not None else training_args.generation_num_beams
    if training_args.do_eval:
        metrics = trainer.evaluate(max_length=max_length, num_beams=num_beams, metric_key_prefix="eval")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if training_args.do_predict:
        out = trainer.predict(predict_dataset, metric_key_prefix="predict", max_length=max_length, num_beams=num_beams)
        trainer.log_metrics("predict", out.metrics)
        trainer.save_metrics("predict", out.metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            preds = np.where(out.predictions != -100, out.predictions, tokenizer.pad_token_id)
            lines = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True,
                                                               clean_up_tokenization_spaces=True)]
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as f:
                f.write("\n".join(lines))

    kwargs = {"finetuned_from": model_args.model_name_or_path, "tasks": "translation",
              "language": [data_args.source_lang, data_args.target_lang]}
    if training_args.push_to_hub:
        trainer.push_to_hub(**kwargs)
    else:
        trainer.create_model_card(**kwargs)


if __name__ == "__main__":
    main()
