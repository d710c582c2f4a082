#!/usr/bin/env python
"""Does `torch.compile` give the eager model's results, for every preset? And what does it gain or cost?

For each preset (on a small model, dropout off) the eager model and a copy compiled in place with
``model.compile()`` (the same compiled forward as ``torch.compile(model)``, but ``model.generate`` then runs it too)
are compared on
  * a training step: loss and backward; the loss and every parameter's gradient must match the eager ones to
    `--rtol` (relative to the largest entry of that gradient), and
  * ``generate``: greedy and beam-`--beams` search of `--decode-len` new tokens; the ids must be identical, and
  * greedy ``generate`` again after every weight changed in place (``updated``; as after an optimiser step).
Each check is ok, mismatch (the largest error, or the first differing row) or error (the exception's first line).
Also recorded: the graph breaks dynamo reports (count and the most frequent reason), the first-call time of each
compiled path (compilation included), and the speed of a training step (forward + backward) and of beam search,
eager against compiled, in `--repeats` interleaved rounds (median of the per-round ratios t_eager / t_compiled,
> 1 = compiled faster). The JSON is rewritten after every preset; ``--docs`` regenerates the block of the
documentation's compile section (`DOCS_PAGE`):

    python scripts/check_compile.py --output results/compile/compile.json                    # every Marian preset
    python scripts/check_compile.py --base bart --presets softmax,rela-g,gmm --output runs/compile_bart.json
    python scripts/check_compile.py --docs docs/speed.md --from results/compile/compile.json [--no-timings]

Timings taken on a busy machine are noise: the JSON records the load average before and after the run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

import hf_attn
from hf_attn.io_utils import replace_marked_block, write_json
from hf_attn.modeling.registry import ATTENTION_VARIANTS

BLOCK_START, BLOCK_END = "<!-- compile:start -->", "<!-- compile:end -->"
DOCS_PAGE = "docs/speed.md"  # the page that holds the generated block
CHECKS = ("train", "greedy", "beam", "updated")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="all", help="comma list, or 'all'")
    p.add_argument("--base", choices=["marian", "bart"], default="marian")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, eager)")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--tgt-len", type=int, default=14)
    p.add_argument("--decode-len", type=int, default=12, help="new tokens per generated sentence")
    p.add_argument("--beams", type=int, default=4)
    p.add_argument("--chunk", type=int, default=None, help="rela_chunk and reluformer_query_chunk (e.g. 4: the "
                   "ReLU family's block-wise path runs on the short test inputs)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="config override for every preset checked, e.g. --set encoder_attention=rela (repeatable; "
                   "the value is read as JSON where it parses, else as a string)")
    p.add_argument("--checks", default=",".join(CHECKS), help=f"comma list of checks to run (of {','.join(CHECKS)})")
    p.add_argument("--rtol", type=float, default=1e-4, help="loss and gradients: error / largest eager entry")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (0: no timings)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default="runs/compile.json")
    p.add_argument("--note", default=None, help="a remark kept in the JSON and shown with the table (e.g. the "
                   "machine was busy)")
    p.add_argument("--docs", dest="docs", nargs="?", const=DOCS_PAGE, default=None, metavar="PAGE",
                   help=f"rewrite the compile block of this page ({DOCS_PAGE} when no PAGE is given) from the --from "
                        "JSON files")
    p.add_argument("--from", dest="sources", nargs="+", default=None, help="check_compile JSON files for --docs")
    p.add_argument("--no-timings", action="store_true", help="--docs: correctness columns only")
    args = p.parse_args(argv)
    if (args.docs is None) != (args.sources is None):
        p.error(f"--docs {DOCS_PAGE} and --from RESULT.json ... go together")
    args.checks = [c.strip() for c in args.checks.split(",") if c.strip()]
    if not args.checks or set(args.checks) - set(CHECKS):
        p.error(f"--checks {','.join(args.checks)!r}: choose among {','.join(CHECKS)}")
    args.overrides = dict(parse_override(p, x) for x in args.overrides)
    names = args.presets.split(",")
    args.presets = sorted(hf_attn.PRESETS) if args.presets == "all" else [x.strip() for x in names if x.strip()]
    for name in args.presets:
        if name not in hf_attn.PRESETS:
            p.error(f"unknown preset {name!r}; valid presets: {sorted(hf_attn.PRESETS)}")
    return args


def parse_override(p, text: str) -> tuple[str, object]:
    field, sep, value = text.partition("=")
    if not sep or not field:
        p.error(f"--set {text!r}: need FIELD=VALUE, e.g. --set encoder_attention=rela")
    try:
        return field, json.loads(value)
    except ValueError:
        return field, value


# ---------------------------------------------------------------------------------------------------------------
# Model, batch, the checks
# ---------------------------------------------------------------------------------------------------------------
def build(base: str, preset: str, seed: int = 0, **sizes):
    """An hf-attn model of `preset` with every dropout off (the model's and the variants' own, e.g. RAN's), so the
    eager and the compiled model compute the same function."""
    variant_dropouts = {h.name: 0.0 for cls in ATTENTION_VARIANTS.values() for h in cls.hyperparameters
                        if h.name.endswith("_dropout")}
    fields = dict(pad_token_id=1, eos_token_id=2, forced_eos_token_id=None, bos_token_id=0, dropout=0.0,
                  attention_dropout=0.0, decoder_start_token_id=1 if base == "marian" else 2, **variant_dropouts,
                  **sizes)
    config_cls = hf_attn.HfAttnMarianConfig if base == "marian" else hf_attn.HfAttnBartConfig
    model_cls = hf_attn.HfAttnMarianMTModel if base == "marian" else hf_attn.HfAttnBartForConditionalGeneration
    torch.manual_seed(seed)
    model = model_cls(config_cls.from_preset(preset, **fields))
    model.set_training_step(0)  # step-driven schedules (calibration-anneal) need it; harmless for the others
    return model


def model_sizes(args) -> dict:
    """The config fields taken from the command line (sizes, and the block size of the ReLU family if given)."""
    chunk = {} if args.chunk is None else {"rela_chunk": args.chunk, "reluformer_query_chunk": args.chunk}
    return dict(vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
                encoder_attention_heads=args.heads, decoder_attention_heads=args.heads, encoder_ffn_dim=args.ffn,
                decoder_ffn_dim=args.ffn, max_position_embeddings=max(64, args.src_len, args.tgt_len + 2,
                                                                     args.decode_len + 2), **chunk)


def make_batch(vocab: int, n: int, src_len: int, tgt_len: int, seed: int = 1) -> dict:
    """Random ids, every other row right-padded to a shorter length (sources end in EOS = 2, pad = 1)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (n, src_len), generator=g)
    labels = torch.randint(3, vocab, (n, tgt_len), generator=g)
    mask = torch.ones_like(src)
    for i in range(1, n, 2):
        keep = max(2, src_len - 1 - i % src_len)
        src[i, keep:], mask[i, keep:] = 1, 0
        labels[i, max(2, tgt_len - i % tgt_len):] = -100
    src[torch.arange(n), mask.sum(1) - 1] = 2
    return {"input_ids": src, "attention_mask": mask, "labels": labels}


def train_step(model, batch) -> tuple[float, dict]:
    """Loss and backward of one training forward; (loss, {parameter name: gradient})."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


@torch.no_grad()
def perturb(model, seed: int = 3, scale: float = 0.1) -> None:
    """Change every trainable weight in place, as an optimiser step does (the same change for copies of a model)."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.requires_grad:
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device), alpha=scale)


def updated_greedy(model, batch, new_tokens: int) -> torch.Tensor:
    """Greedy generation after the weights changed in place: state computed once from the weights (RAN's cached
    matrices in eval mode) must follow them, also in a compiled model."""
    perturb(model)
    return generate(model, batch, 1, new_tokens)


@torch.no_grad()
def generate(model, batch, beams: int, new_tokens: int) -> torch.Tensor:
    model.eval()
    return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=beams,
                          do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def compare_train(eager: tuple[float, dict], compiled: tuple[float, dict], rtol: float) -> dict:
    """ok when the loss and every gradient agree to `rtol`: the largest error of a tensor over its largest eager
    entry, or over 1e-4 of the model's largest gradient entry where a gradient is nearly zero throughout (softmax's
    key bias gets none in exact arithmetic: its entries are rounding noise)."""
    loss_e, grads_e = eager
    loss_c, grads_c = compiled
    if set(grads_e) != set(grads_c):
        missing = sorted(set(grads_e) ^ set(grads_c))
        return {"status": "mismatch", "reason": f"gradients present differ: {missing[:3]}"}
    errors = {"loss": abs(loss_c - loss_e) / max(abs(loss_e), 1e-12)}
    floor = 1e-4 * max([g.abs().max().item() for g in grads_e.values()] + [1e-12])
    for name, g in grads_e.items():
        errors[name] = (grads_c[name] - g).abs().max().item() / max(g.abs().max().item(), floor)
    worst = max(errors, key=lambda k: errors[k])
    result = {"max_rel_error": errors[worst], "worst": worst}
    if not all(e <= rtol for e in errors.values()):  # (also catches NaN)
        return {"status": "mismatch", "reason": f"{worst}: relative error {errors[worst]:.2e} > {rtol:g}", **result}
    return {"status": "ok", **result}


def compare_ids(eager: torch.Tensor, compiled: torch.Tensor) -> dict:
    if eager.shape == compiled.shape and torch.equal(eager, compiled):
        return {"status": "ok"}
    if eager.shape != compiled.shape:
        return {"status": "mismatch", "reason": f"shapes {tuple(eager.shape)} vs {tuple(compiled.shape)}"}
    row = int((eager != compiled).any(1).nonzero()[0])
    return {"status": "mismatch", "reason": f"row {row}: {eager[row].tolist()} vs {compiled[row].tolist()}"}


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def timed(fn, *a) -> float:
    start = time.perf_counter()
    fn(*a)
    return time.perf_counter() - start


def graph_breaks() -> dict:
    """Dynamo's graph-break count since the last reset, and its most frequent reason."""
    from torch._dynamo.utils import counters

    reasons = Counter({k: v for k, v in counters["graph_break"].items()})
    top = reasons.most_common(1)
    return {"count": sum(reasons.values()), "top_reason": top[0][0].splitlines()[0][:200] if top else None}


def check_preset(args, preset: str) -> dict:
    """Eager against compiled for one preset: the four checks, graph breaks, compile and step times."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    eager = build(args.base, preset, **model_sizes(args), **args.overrides)
    compiled = copy.deepcopy(eager)
    compiled.compile(backend=args.backend)
    batch = make_batch(args.vocab, args.batch, args.src_len, args.tgt_len)
    row: dict = {"preset": preset, "compile_s": {}}
    fns = {
        "train": lambda m: train_step(m, batch),
        "greedy": lambda m: generate(m, batch, 1, args.decode_len),
        "beam": lambda m: generate(m, batch, args.beams, args.decode_len),
        "updated": lambda m: updated_greedy(m, batch, args.decode_len),
    }
    for check in CHECKS:
        if check not in args.checks:
            row[check] = {"status": "skipped"}
            continue
        try:
            torch.manual_seed(0)
            want = fns[check](eager)
            torch.manual_seed(0)
            start = time.perf_counter()
            got = fns[check](compiled)
            row["compile_s"][check] = time.perf_counter() - start
            row[check] = compare_train(want, got, args.rtol) if check == "train" else compare_ids(want, got)
        except Exception as e:  # a failure is a result: recorded, and the next check runs
            row[check] = {"status": "error", "reason": first_line(e)}
    row["graph_breaks"] = graph_breaks()
    if args.repeats and all(row[c]["status"] == "ok" for c in ("train", "beam")):  # (not timed unless both ran)
        times = {(kind, name): [] for kind in ("train", "beam") for name in ("eager", "compiled")}
        for _ in range(args.repeats):  # interleaved: eager, compiled, eager, ... (shared load cancels in the ratio)
            for name, model in (("eager", eager), ("compiled", compiled)):
                times["train", name].append(timed(fns["train"], model))
                times["beam", name].append(timed(fns["beam"], model))
        for kind in ("train", "beam"):
            e, c = times[kind, "eager"], times[kind, "compiled"]
            row[f"{kind}_eager_s"], row[f"{kind}_compiled_s"] = statistics.median(e), statistics.median(c)
            row[f"{kind}_speedup"] = statistics.median(a / b for a, b in zip(e, c))
    return row


def status_of(row: dict) -> str:
    states = {row[c]["status"] for c in CHECKS}
    return "error" if "error" in states else "mismatch" if "mismatch" in states else "ok" if "ok" in states else "-"


# ---------------------------------------------------------------------------------------------------------------
# Main, JSON, docs block
# ---------------------------------------------------------------------------------------------------------------
def settings(args, argv) -> dict:
    keep = ("note", "base", "backend", "checks", "overrides", "chunk", "d_model", "layers", "heads", "ffn", "vocab",
            "batch", "src_len", "tgt_len", "decode_len", "beams", "rtol", "repeats", "threads")
    return {**{k: getattr(args, k) for k in keep}, "command": shlex.join(["python", "scripts/check_compile.py", *argv]),
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "cpu_count": os.cpu_count(), "load_average_before": list(os.getloadavg())}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.docs:
        return update_docs(Path(args.docs), [Path(s) for s in args.sources], timings=not args.no_timings)
    torch.set_num_threads(args.threads)
    result = {"settings": settings(args, argv), "rows": []}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(args.presets, desc=f"compile checks ({args.base}, {args.backend})")
    for preset in bar:
        bar.set_postfix_str(preset)
        row = check_preset(args, preset)
        result["rows"].append(row)
        result["settings"]["load_average_after"] = list(os.getloadavg())
        write_json(out, result)  # after every preset: a long run keeps what it has done
        tqdm.write(f"{preset}: {status_of(row)} " + "; ".join(
            f"{c} {row[c]['status']}" + (f" ({row[c]['reason']})" if "reason" in row[c] else "") for c in CHECKS))
    print(render_table(result, timings=True))
    print(f"wrote {out}")
    return result


def _reason(row: dict) -> str:
    return "; ".join(f"{c}: {row[c]['reason']}" for c in CHECKS if "reason" in row[c])


def render_table(result: dict, timings: bool) -> str:
    s = result["settings"]
    head = (f"{s['base']} d_model={s['d_model']} layers={s['layers']}+{s['layers']} heads={s['heads']} "
            f"ffn={s['ffn']} vocab={s['vocab']}"
            + (f", rela_chunk = reluformer_query_chunk = {s['chunk']}" if s.get("chunk") else "")
            + "".join(f", {k}={v}" for k, v in s.get("overrides", {}).items())
            + f", dropout off; training step on {s['batch']} x "
            f"{s['src_len']}/{s['tgt_len']} tokens (gradients to rtol {s['rtol']:g}), greedy and beam-{s['beams']} "
            f"generation of {s['decode_len']} tokens, and greedy again after a weight update (identical ids); "
            f"backend {s['backend']}, torch {s['torch']}, transformers {s['transformers']}")
    cols = ["preset", "result", *CHECKS, "graph breaks"]
    if timings:
        head += (f"; {s['threads']} threads, {s['repeats']} interleaved rounds, speedup = median t_eager / t_compiled "
                 f"(> 1 = compiled faster); load average {s['load_average_before'][0]:.1f} before, "
                 f"{s.get('load_average_after', [float('nan')])[0]:.1f} after")
        cols += ["first call s (" + " / ".join(CHECKS) + ")", "train speedup", "beam speedup"]
    if s.get("note"):
        head += f". Note: {s['note']}"
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in result["rows"]:
        cells = [r["preset"], status_of(r)] + [r[c]["status"] for c in CHECKS]
        cells.append(str(r["graph_breaks"]["count"]))
        if timings:
            cells.append(" / ".join(f"{r['compile_s'][c]:.0f}" if c in r["compile_s"] else "-" for c in CHECKS))
            cells += [f"{r[k]:.2f}x" if k in r else "-" for k in ("train_speedup", "beam_speedup")]
        lines.append("| " + " | ".join(cells) + " |")
    failures = [f"- `{r['preset']}`: {_reason(r)}" for r in result["rows"] if status_of(r) != "ok"]
    return "\n".join(lines + ([""] + failures if failures else []))


def update_docs(page: Path, sources: list[Path], timings: bool = True) -> str:
    parts = [f"Generated by `python scripts/check_compile.py --docs {DOCS_PAGE} --from "
             + " ".join(p.as_posix() for p in sources) + ("" if timings else " --no-timings") + "` from these runs:"]
    results = []
    for path in sources:
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
            render_table(results[-1], timings)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"check_compile: {path} is not a check_compile result ({type(e).__name__}: {e}); pass "
                             "the JSON that scripts/check_compile.py --output wrote")
    for i, result in enumerate(results):
        # a later run of the same base and backend supersedes an earlier one's rows (a re-check after a code change)
        later = {r["preset"] for other in results[i + 1:] for r in other["rows"]
                 if (other["settings"]["base"], other["settings"]["backend"])
                 == (result["settings"]["base"], result["settings"]["backend"])}
        kept = [r for r in result["rows"] if r["preset"] not in later]
        if not kept:
            continue
        # timing columns only for a run that timed something (--repeats 0 checks correctness alone)
        table = render_table({**result, "rows": kept}, timings and result["settings"]["repeats"] > 0)
        dropped = sorted({r["preset"] for r in result["rows"]} - {r["preset"] for r in kept})
        note = [f"(rows of {', '.join(dropped)} superseded by a later run below)"] if dropped else []
        parts += ["", "```bash", result["settings"]["command"], "```", "", table, *([""] + note if note else [])]
    body = "\n".join(parts)
    if not replace_marked_block(page, BLOCK_START, BLOCK_END, body):
        raise SystemExit(f"check_compile: {page} has no block between {BLOCK_START} and {BLOCK_END}; add the two "
                         "marker lines where the table belongs")
    print(f"updated the compile block of {page}")
    return body


if __name__ == "__main__":
    main()
