"""A benchmark result file, typed: what `scripts/benchmark.py` writes, and what the docs' Speed block, the report
and the paper claims read.

The JSON holds ``settings`` (a `BenchSettings` plus the command, torch version and device) and either ``rows`` (the
sentence-level mode: per model a training step and a beam search, with the per-round ``times`` and, compiled,
``compile_fallbacks``) or ``long_rows`` (the long-sequence mode: per input length and model one forward + backward).
A row's timings are flat keys ``<call>_<field>`` (``train_median_s``, ``decode_ratio_vs_stock``, ...), one
`CallTiming` per call. Files written before the ``compile`` and ``profile`` settings existed read as neither.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

STOCK = "stock-sdpa"  # the reference model's row: stock transformers with attn_implementation="sdpa"
SENTENCE_CALLS = ("train", "decode")  # the calls timed in the sentence-level mode
LONG_CALL = "fwd_bwd"  # the call timed in the long-sequence mode
DEFAULT_PRESETS = ("softmax", "sparsemax", "entmax15", "rela-g", "gmm", "ran-all", "ran-d", "calibration-gate")


class NotABenchmarkResult(ValueError):
    """A file that is not the JSON `scripts/benchmark.py` writes."""


@dataclass(frozen=True)
class BenchSettings:
    """What a benchmark run measures (the script's flags; the defaults are its defaults). ``presets`` starts with
    softmax; ``long``: the input lengths of the long-sequence mode, None for the sentence-level mode; ``compile``:
    the torch.compile backend every model runs under, None for eager."""

    presets: tuple[str, ...] = DEFAULT_PRESETS
    base: str = "marian"
    d_model: int = 256
    layers: int = 3  # encoder and decoder layers each
    heads: int = 4
    ffn: int = 1024
    vocab: int = 8000
    batch: int = 32
    src_len: int = 30
    tgt_len: int = 30
    pad_fraction: float = 0.25  # share of the rows that are padded
    decode_batch: int = 16
    decode_src_len: int = 24
    decode_len: int = 24  # new tokens per decoded sentence
    beams: int = 4
    repeats: int = 5
    threads: int = 2
    device: str = "cpu"
    no_memory: bool = False  # no per-model memory subprocesses
    no_decode: bool = False  # time training steps only
    compile: str | None = None
    profile: bool = False
    output: str = "runs/benchmark.json"
    long: tuple[int, ...] | None = None
    long_batch: int = 2  # sequences per forward + backward in the long-sequence mode

    @property
    def calls(self) -> tuple[str, ...]:
        """The calls timed per model in the sentence-level mode."""
        return ("train",) if self.no_decode else SENTENCE_CALLS

    @property
    def max_len(self) -> int:
        """The longest position any batch of this run uses."""
        return max([self.src_len, self.tgt_len, self.decode_src_len, self.decode_len + 2, *(self.long or ())])

    @classmethod
    def from_json(cls, data: dict) -> "BenchSettings":
        optional = {"compile", "profile"}  # (files written before these settings existed)
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in optional]
        if missing:
            raise NotABenchmarkResult(f"settings lack {missing}")
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["presets"] = tuple(values["presets"])
        values["long"] = None if values["long"] is None else tuple(values["long"])
        return cls(**values)


@dataclass(frozen=True)
class Profile:
    """Per call of a model, from torch.profiler: the wall time, the operators' total self time, the largest operators'
    self times (largest first), the operator calls (nested ones too) and the SDPA operators' time. ``op_calls`` and
    ``attention_s`` are None in files written before they were recorded."""

    wall_s: float
    op_s: float
    ops: dict[str, float]
    op_calls: float | None = None
    attention_s: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: dict) -> "Profile":
        return cls(data["wall_s"], data["op_s"], data["ops"], data.get("op_calls"), data.get("attention_s"))


@dataclass(frozen=True)
class CallTiming:
    """One model's timing of one call (a training step, a beam search, a forward + backward): the median seconds,
    the median per-round ratios t_reference / t_model against stock and hf-attn softmax (> 1 = faster), the untimed
    warm-up seconds, the FLOP bound against stock, the share stock spends in SDPA (stock's row only) and a profile."""

    median_s: float
    ratio_vs_stock: float
    ratio_vs_softmax: float
    warmup_s: float | None = None
    flop_ratio_vs_stock: float | None = None
    attention_share: float | None = None
    profile: Profile | None = None

    def to_json(self, call: str) -> dict:
        out = {f"{call}_median_s": self.median_s}
        if self.warmup_s is not None:
            out[f"{call}_warmup_s"] = self.warmup_s
        out[f"{call}_ratio_vs_stock"] = self.ratio_vs_stock
        out[f"{call}_ratio_vs_softmax"] = self.ratio_vs_softmax
        for name in ("flop_ratio_vs_stock", "attention_share"):
            if getattr(self, name) is not None:
                out[f"{call}_{name}"] = getattr(self, name)
        if self.profile is not None:
            out[f"{call}_profile"] = self.profile.to_json()
        return out

    @classmethod
    def from_json(cls, row: dict, call: str) -> "CallTiming":
        profile = row.get(f"{call}_profile")
        return cls(row[f"{call}_median_s"], row[f"{call}_ratio_vs_stock"], row[f"{call}_ratio_vs_softmax"],
                   row.get(f"{call}_warmup_s"), row.get(f"{call}_flop_ratio_vs_stock"),
                   row.get(f"{call}_attention_share"), None if profile is None else Profile.from_json(profile))


@dataclass(frozen=True)
class SentenceRow:
    """One model of a sentence-level run: its timings per call, and the peak memory growth of one training step
    (None: the measuring process failed, or the run measured no memory)."""

    preset: str
    calls: dict[str, CallTiming]
    params: int | None = None
    train_peak_mem_mib: float | None = None

    def to_json(self, with_memory: bool) -> dict:
        out: dict = {"preset": self.preset}
        if self.params is not None:
            out["params"] = self.params
        for call, timing in self.calls.items():
            out.update(timing.to_json(call))
        if with_memory:
            out["train_peak_mem_mib"] = self.train_peak_mem_mib
        return out

    @classmethod
    def from_json(cls, row: dict, calls: tuple[str, ...]) -> "SentenceRow":
        return cls(row["preset"], {call: CallTiming.from_json(row, call) for call in calls}, row.get("params"),
                   row.get("train_peak_mem_mib"))


@dataclass(frozen=True)
class LongRow:
    """One model at one input length of a long-sequence run: forward + backward, tokens per second, and the peak
    memory growth of one forward + backward (None: not measured, or the measuring process failed)."""

    length: int
    preset: str
    fwd_bwd: CallTiming
    tokens_per_s: float
    peak_mem_mib: float | None

    def to_json(self) -> dict:
        timing = self.fwd_bwd.to_json(LONG_CALL)
        profile = timing.pop(f"{LONG_CALL}_profile", None)
        out = {"length": self.length, "preset": self.preset, **timing, "tokens_per_s": self.tokens_per_s,
               "peak_mem_mib": self.peak_mem_mib}
        return out if profile is None else {**out, f"{LONG_CALL}_profile": profile}

    @classmethod
    def from_json(cls, row: dict) -> "LongRow":
        return cls(row["length"], row["preset"], CallTiming.from_json(row, LONG_CALL), row["tokens_per_s"],
                   row["peak_mem_mib"])


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark result file. ``times``: {call: {model: seconds per round}} (sentence-level mode);
    ``compile_fallbacks``: dynamo's recompile-limit warnings (compiled runs; None for eager ones)."""

    settings: BenchSettings
    command: str
    torch_version: str
    device_name: str
    rows: tuple[SentenceRow, ...] = ()
    long_rows: tuple[LongRow, ...] = ()
    times: dict[str, dict[str, list[float]]] | None = None
    compile_fallbacks: list[str] | None = None

    @property
    def is_long(self) -> bool:
        return self.settings.long is not None

    def row(self, preset: str) -> SentenceRow | None:
        return next((r for r in self.rows if r.preset == preset), None)

    def to_json(self) -> dict:
        settings = {**asdict(self.settings), "command": self.command, "torch": self.torch_version,
                    "device_name": self.device_name}
        settings["presets"] = list(self.settings.presets)
        settings["long"] = None if self.settings.long is None else list(self.settings.long)
        if self.is_long:
            return {"settings": settings, "long_rows": [r.to_json() for r in self.long_rows]}
        out = {"settings": settings, "rows": [r.to_json(not self.settings.no_memory) for r in self.rows],
               "times": self.times}
        return out if self.compile_fallbacks is None else {**out, "compile_fallbacks": self.compile_fallbacks}

    @classmethod
    def from_json(cls, data: dict) -> "BenchmarkResult":
        try:
            s = data["settings"]
            settings = BenchSettings.from_json(s)
            head = dict(settings=settings, command=s["command"], torch_version=s["torch"], device_name=s["device_name"])
            if "long_rows" in data:
                return cls(**head, long_rows=tuple(LongRow.from_json(r) for r in data["long_rows"]))
            return cls(**head, rows=tuple(SentenceRow.from_json(r, settings.calls) for r in data["rows"]),
                       times=data.get("times"), compile_fallbacks=data.get("compile_fallbacks"))
        except (KeyError, TypeError, AttributeError) as e:
            raise NotABenchmarkResult(f"{type(e).__name__}: {e}") from e


def load_result(path: Path) -> BenchmarkResult:
    """The benchmark result in the JSON file ``path``; `NotABenchmarkResult` if it is none."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NotABenchmarkResult(f"{type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise NotABenchmarkResult("not a JSON object")
    return BenchmarkResult.from_json(data)

