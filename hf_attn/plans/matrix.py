"""The runs of `hf-attn reproduce`: `RunSpec` (one cell: preset, pair, budget, seed, base and extra `hf-attn train`
flags; a retrofit child also names its parent run), the matrix of a command line (`matrix`) or of an experiments file
(`experiment_specs`), and where a run's record lives (`record_path`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HfAttnInputError
from ..modeling.presets import check_preset


STEP0_SUFFIX = ".step0"  # a retrofit child's swapped model before any update: runs_dir/<name>.step0
AVERAGED_HYPS = ".avg.hyp.txt"  # beside <name>.json: the test translations of the checkpoint-averaging arm


@dataclass(frozen=True)
class RunSpec:
    """One cell of the matrix; ``name`` identifies it in ``runs_dir`` and in the report's records."""

    preset: str
    source: str
    target: str
    steps: int
    seed: int
    base: str = "marian"
    train_args: tuple = field(default_factory=tuple)
    parent: str = ""  # a retrofit child (`retrofit.py`): the name of the run whose model it starts from, swapped

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"

    @property
    def setup(self) -> str:
        """Everything but the preset: runs with the same setup are compared with each other (and with softmax). A
        retrofit child's is its parent's name, ``+``, its own steps and flags (``de-en_1200steps_seed42_softmax+600steps_x...``)."""
        extra = f"_x{hashlib.sha1(' '.join(self.train_args).encode()).hexdigest()[:6]}" if self.train_args else ""
        if self.parent:
            return f"{self.parent}+{self.steps}steps{extra}"
        return f"{'' if self.base == 'marian' else self.base + '_'}{self.pair}_{self.steps}steps_seed{self.seed}{extra}"

    @property
    def name(self) -> str:
        return f"{self.setup}_{self.preset}"

    def train_argv(self, output_dir: Path, resume: bool) -> list[str]:
        argv = ["--preset", self.preset, "--base", self.base, "--source", self.source, "--target", self.target,
                "--max_steps", str(self.steps), "--seed", str(self.seed), "--output_dir", str(output_dir),
                *self.train_args]
        if self.parent:  # the swapped parent, saved beside the run before it trains (`retrofit.step_zero_dir`)
            argv += ["--init_from", str(Path(output_dir).parent / f"{self.name}{STEP0_SUFFIX}")]
        return argv + (["--resume"] if resume else [])


def csv_values(text: str, flag: str, kind=str) -> list:
    items = [x.strip() for x in text.split(",") if x.strip()]
    try:
        items = [kind(x) for x in items]
    except ValueError:
        raise HfAttnInputError(f"{flag} {text!r}: give comma-separated {kind.__name__} values") from None
    if not items:
        raise HfAttnInputError(f"{flag} {text!r}: give at least one value")
    return items


def matrix(presets, pairs, steps, seeds, base="marian", train_args=()) -> list[RunSpec]:
    """Every (pair, steps, seed, preset) combination, softmax first within a setup (it is every run's baseline)."""
    for p in presets:
        check_preset(p, "--presets:", "; `hf-attn presets` lists them")
    for pair in pairs:
        if pair.count("-") != 1 or not all(pair.split("-")):
            raise HfAttnInputError(f"--pairs: {pair!r} is not SOURCE-TARGET, e.g. de-en or ru-en (`hf-attn corpora`)")
    for n in steps:
        if n < 1:
            raise HfAttnInputError(f"--steps {n}: need at least 1 training step")
    for s in seeds:
        if not 0 <= s < 2 ** 32:
            raise HfAttnInputError(f"--seeds {s}: need seeds in [0, {2 ** 32 - 1}]")
    ordered = sorted(presets, key=lambda p: p != "softmax")
    return [RunSpec(p, *pair.split("-"), n, s, base, tuple(train_args))
            for pair in pairs for n in steps for s in seeds for p in ordered]


def experiment_specs(path: Path, only: list[str] | None = None, check=None) -> list[RunSpec]:
    """The runs of an experiments file (`results/experiments.json`): every cell ``PRESET@ARM`` of every experiment
    (or of those named in ``only``), at the file's seeds, pair and base and the experiment's step budget, with the
    arm's extra `hf-attn train` flags; in file order, each run once. ``check(cfg, label)``, when given, checks the
    file's layout first (one line for a file that is JSON but not an experiments file)."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HfAttnInputError(f"--experiments {str(path)!r}: cannot read it as JSON ({e})") from None
    if check is not None:  # the report's `check_experiments` (the runner passes it: plans import no report)
        check(cfg, f"--experiments {str(path)!r}")
    known = [x["id"] for x in cfg["experiments"]]
    for name in only or ():
        if name not in known:
            raise HfAttnInputError(f"--only {name!r} is not an experiment of {str(path)!r}; valid: {', '.join(known)}")
    source, target = cfg["pair"].split("-")
    specs: dict[str, RunSpec] = {}
    for x in cfg["experiments"]:
        if only and x["id"] not in only:
            continue
        for cell in x["cells"]:
            preset, arm = cell.split("@")
            for seed in cfg["seeds"]:
                spec = RunSpec(preset, source, target, x["steps"], seed, cfg.get("base", "marian"), tuple(x["arms"][arm]))
                specs.setdefault(spec.name, spec)
    matrix([s.preset for s in specs.values()], [cfg["pair"]], [1], [0])  # presets and pair checked as in a matrix
    return list(specs.values())


def record_path(output_dir: Path, spec: RunSpec) -> Path:
    """``output_dir/runs/<name>.json``: the record `runner.run_one` writes and the report reads."""
    return Path(output_dir) / "runs" / f"{spec.name}.json"
