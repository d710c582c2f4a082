"""The model code a saved model ships with, on the transformers of whoever loads it (issue 51, "Hub reach").

Tiny models of every variant family, Marian and BART (`saved_models`), are saved by the current code, laid out in a
Hub cache and loaded with ``AutoModelForSeq2SeqLM.from_pretrained(..., trust_remote_code=True)``, offline, by repo id
and from their directory, in one process per transformers release: a throwaway environment (``pip install
--target`` of that transformers and its dependencies, beside the installed torch and entmax) where hf_attn cannot be
imported. Their logits and beam-3 ids must equal the saving environment's, bitwise; below the floor
(`compat.MIN_TRANSFORMERS`) every load must stop with the one-line `TransformersVersionError`. The library itself
(hf_attn installed) is checked at the low end of pyproject's transformers range: a few tests of the suite (a training
step, save/load, the models saved by an earlier release) run there.

The releases' wheels are fetched once into ``~/.cache/hf_attn/compat`` (``HF_ATTN_COMPAT_CACHE``) and installed there
once; a release that can be neither found there nor fetched (no network) is skipped, with the reason.

Versions: `CI_VERSIONS` (below the floor, the floor, the library's low end, the newest) by default;
``HF_ATTN_COMPAT_VERSIONS=all`` (or a list) runs `ALL_VERSIONS`, the newest patch of every minor release. Each
version's results must equal its row of `RECORD`, from which ``python scripts/write_transformers_table.py`` writes the
table of docs/python.md ("Which transformers"); ``HF_ATTN_COMPAT_RECORD=1`` writes the rows of the versions run
instead (`RECORD_COMMAND`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from saved_models import config_kwargs, outputs, perturb

from hf_attn.modeling import BASES
from hf_attn.modeling.compat import MIN_TRANSFORMERS, version_tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RECORD = HERE / "transformers_versions.json"
RECORD_COMMAND = ("HF_ATTN_COMPAT_VERSIONS=all HF_ATTN_COMPAT_RECORD=1 python -m pytest -q -p no:xdist "
                  "tests/hub/test_transformers_versions.py")
CACHE = Path(os.environ.get("HF_ATTN_COMPAT_CACHE") or Path.home() / ".cache" / "hf_attn" / "compat")

BELOW = "4.57.6"  # the last 4.x release
LIBRARY_LOW = "5.17.0"  # the low end of pyproject's transformers range (the GPU machines' image)
NEWEST = "5.24.0"
CI_VERSIONS = (BELOW, MIN_TRANSFORMERS, LIBRARY_LOW, NEWEST)
ALL_VERSIONS = ("4.46.3", "4.57.6", "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4", "5.6.2", "5.7.0", "5.8.1",
                "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1", "5.16.1", "5.17.0", "5.18.0",
                "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0")
FAMILIES = ("softmax", "entmax15", "rela-g", "gmm", "reluformer", "ran-all", "hard-gaussian", "calibration-gate")
MODELS = [(base, preset) for base in ("marian", "bart") for preset in FAMILIES]
# the suite's tests run with hf_attn installed beside transformers LIBRARY_LOW
LIBRARY_TESTS = ("tests/training/test_trainer.py::test_aux_loss_is_trained_on",
                 "tests/modeling/test_save_load.py::test_variant_params_survive_reload_and_are_not_reinitialised",
                 "tests/modeling/test_save_load.py::test_loading_keeps_the_sinusoidal_positions_frozen",
                 "tests/hub/test_earlier_saves.py")
TIMEOUT = 600


def versions() -> tuple[str, ...]:
    chosen = os.environ.get("HF_ATTN_COMPAT_VERSIONS", "").strip()
    if chosen == "all":
        return ALL_VERSIONS
    return tuple(chosen.replace(",", " ").split()) if chosen else CI_VERSIONS


def below_floor(version: str) -> bool:
    return version_tuple(version) < version_tuple(MIN_TRANSFORMERS)


def refusal(version: str) -> str:
    """The one line every load gives below the floor, as `saved_models.error_result` reports it."""
    return (f"error: TransformersVersionError: this hf-attn model needs transformers >= {MIN_TRANSFORMERS}, but "
            f'transformers {version} is installed: pip install -U "transformers>={MIN_TRANSFORMERS}"')


# ---- the throwaway environments -------------------------------------------------------------------------------
def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def _last_line(p: subprocess.CompletedProcess) -> str:
    lines = [x for x in (p.stderr + p.stdout).splitlines() if x.strip() and not x.startswith("WARNING")]
    return lines[-1].strip() if lines else f"exit status {p.returncode}"


def environment(version: str) -> Path:
    """``site-packages`` of a throwaway install of transformers ``version`` and its dependencies (torch is not one):
    built once under `CACHE` from wheels fetched once; `pytest.skip` with the reason where they cannot be had."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    site = CACHE / f"site-{version}-{tag}"
    if (site / ".complete").exists():
        return site
    wheels = CACHE / "wheels" / tag
    wheels.mkdir(parents=True, exist_ok=True)
    partial = CACHE / f"partial-{version}-{tag}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    install = ("install", "--quiet", "--no-index", "--find-links", str(wheels), "--target", str(partial),
               f"transformers=={version}")
    p = _pip(*install)
    if p.returncode != 0:  # not all in the wheel cache yet: fetch them (the only step that needs the network)
        fetch = _pip("download", "--quiet", "--only-binary=:all:", "--retries", "1", "--timeout", "20", "--dest",
                     str(wheels), f"transformers=={version}")
        if fetch.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            pytest.skip(f"transformers {version}: its wheels are not in {wheels} and pip could not fetch them "
                        f"({_last_line(fetch)})")
        p = _pip(*install)
    if p.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        pytest.fail(f"transformers {version}: pip install --target failed: {_last_line(p)}")
    shutil.rmtree(site, ignore_errors=True)
    partial.rename(site)
    (site / ".complete").write_text(version + "\n")
    return site


def run_in(site: Path, args: list[str], tmp: Path, **env) -> subprocess.CompletedProcess:
    """``python args`` with ``site`` first on the path (its transformers shadows the installed one), offline."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "PYTHONPATH": str(site),
           "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp / "hf"),
           "HF_MODULES_CACHE": str(tmp / "modules"), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error", **env}
    return subprocess.run([sys.executable, *args], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def package_version(site: Path, name: str) -> str:
    found = sorted(site.glob(f"{name}-*.dist-info"))
    return found[0].name[len(name) + 1:-len(".dist-info")] if found else "?"


# ---- the saved models -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """The tiny models saved by the current code: ``dirs/<name>``, the same files in a Hub cache (``hub``), their
    outputs in this environment (``expected.pt``) and the loader's job (``job.json``)."""
    root = tmp_path_factory.mktemp("saved")
    revision = "51" * 20
    expected, models = {}, []
    for seed, (base, preset) in enumerate(MODELS):
        name = f"{base}-{preset}"
        torch.manual_seed(seed)
        model = BASES[base].model_class(BASES[base].config_class.from_preset(preset, **config_kwargs(base, preset)))
        perturb(model, seed)
        # each directory is named `model` (under its own parent): transformers imports the code of the directory
        # loads, byte for byte the same files, once under that name (the Hub loads, one module per repo id, still
        # import it apiece), and compares every directory's files with it
        local = root / "dirs" / name / "model"
        model.save_pretrained(local)
        expected[name] = outputs(model)
        repo = root / "hub" / f"models--hf-attn-compat--{name}"
        shutil.copytree(local, repo / "snapshots" / revision)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
        models.append({"name": name, "repo_id": f"hf-attn-compat/{name}", "dir": str(local)})
    torch.save(expected, root / "expected.pt")
    (root / "job.json").write_text(json.dumps({"expected": str(root / "expected.pt"), "models": models}))
    return root


def summary(results: list[str]) -> str:
    """``exact: 16 of 16`` or, per distinct result, ``N of 16: result``."""
    counts = {r: results.count(r) for r in dict.fromkeys(results)}
    return "; ".join(f"exact: {n} of {len(results)}" if r == "exact" else f"{n} of {len(results)}: {r}"
                     for r, n in counts.items())


def load_everywhere(version: str, saved: Path, tmp: Path) -> dict:
    """One process with transformers ``version`` loads every model both ways: its record row."""
    site = environment(version)
    start = time.perf_counter()
    p = run_in(site, [str(ROOT / "tests" / "saved_models.py"), str(saved / "job.json")], tmp,
               HF_HUB_CACHE=str(saved / "hub"))
    seconds = time.perf_counter() - start
    lines = [json.loads(x[len("RESULT "):]) for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and len(lines) == 2 * len(MODELS), p.stdout[-2000:] + p.stderr[-3000:]
    assert {x["transformers"] for x in lines} == {version}, "the loader did not run the transformers under test"
    by_path = {path: [x["result"] for x in lines if x["path"] == path] for path in ("hub", "dir")}
    print(f"transformers {version}: {len(lines)} loads in {seconds:.1f} s")
    return {"transformers": version, "huggingface_hub": package_version(site, "huggingface_hub"),
            "tokenizers": package_version(site, "tokenizers"), "models": len(MODELS),
            "hub": summary(by_path["hub"]), "dir": summary(by_path["dir"])}


def read_record() -> dict:
    return json.loads(RECORD.read_text(encoding="utf-8")) if RECORD.exists() else {"rows": []}


def write_row(row: dict) -> None:
    """Replace ``row``'s version in `RECORD` (rows in version order)."""
    record = read_record()
    rows = [r for r in record["rows"] if r["transformers"] != row["transformers"]] + [row]
    record = {"settings": {"command": RECORD_COMMAND, "floor": MIN_TRANSFORMERS, "torch": torch.__version__,
                           "models": [f"{b}-{p}" for b, p in MODELS]},
              "rows": sorted(rows, key=lambda r: version_tuple(r["transformers"])),
              **{k: v for k, v in record.items() if k not in ("settings", "rows")}}
    RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def check_against_record(row: dict) -> None:
    if os.environ.get("HF_ATTN_COMPAT_RECORD") == "1":
        write_row(row)
        return
    recorded = {r["transformers"]: r for r in read_record()["rows"]}
    assert row["transformers"] in recorded, (f"transformers {row['transformers']} has no row in {RECORD.name}: "
                                             f"run {RECORD_COMMAND}")
    want = recorded[row["transformers"]]
    assert {k: row[k] for k in ("models", "hub", "dir")} == {k: want[k] for k in ("models", "hub", "dir")}, (
        f"the results differ from {RECORD.name}'s row: rerun {RECORD_COMMAND}, then "
        "python scripts/write_transformers_table.py")


@pytest.mark.slow
@pytest.mark.parametrize("version", versions())
def test_saved_models_load_on_transformers(version, saved, tmp_path):
    row = load_everywhere(version, saved, tmp_path)
    n = len(MODELS)
    if below_floor(version):
        want = f"{n} of {n}: {refusal(version)}"
    else:
        want = f"exact: {n} of {n}"
    assert (row["hub"], row["dir"]) == (want, want)
    check_against_record(row)


@pytest.mark.slow
def test_the_library_at_the_low_end_of_its_range(tmp_path):
    """hf-attn installed beside transformers `LIBRARY_LOW`: a training step, save/load, earlier releases' models."""
    site = environment(LIBRARY_LOW)
    check = "import sys, transformers; sys.exit(transformers.__version__ != sys.argv[1])"
    assert run_in(site, ["-c", check, LIBRARY_LOW], tmp_path).returncode == 0
    p = run_in(site, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(ROOT),
                      *(str(ROOT / t) for t in LIBRARY_TESTS)], tmp_path, PYTHONPATH=f"{site}{os.pathsep}{ROOT}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    passed = re.findall(r"(\d+) passed", p.stdout)
    print(f"transformers {LIBRARY_LOW}, hf_attn installed: {p.stdout.strip().splitlines()[-1]}")
    if os.environ.get("HF_ATTN_COMPAT_RECORD") == "1":
        record = read_record()
        record["library"] = {"transformers": LIBRARY_LOW, "tests": list(LIBRARY_TESTS),
                             "result": f"{passed[-1]} passed" if passed else "?"}
        RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def test_the_ci_versions_span_the_range():
    assert below_floor(BELOW) and not below_floor(LIBRARY_LOW) and MIN_TRANSFORMERS in ALL_VERSIONS
    assert set(CI_VERSIONS) <= set(ALL_VERSIONS) and NEWEST == ALL_VERSIONS[-1]
    assert version_tuple(MIN_TRANSFORMERS) <= version_tuple(LIBRARY_LOW) < version_tuple(NEWEST)


def test_the_floor_is_in_the_code_the_saved_config_and_the_model_card(tmp_path):
    from hf_attn.modeling.compat import TransformersVersionError, check_transformers
    from hf_attn.training.cards import render_directory_card, render_model_card

    with pytest.raises(TransformersVersionError) as caught:
        check_transformers("4.57.6")
    assert f"error: TransformersVersionError: {caught.value}" == refusal("4.57.6") and "\n" not in str(caught.value)
    check_transformers(MIN_TRANSFORMERS)
    check_transformers(NEWEST)
    model = BASES["bart"].model_class(BASES["bart"].config_class.from_preset("gmm", **config_kwargs("bart", "gmm")))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["min_transformers_version"] == MIN_TRANSFORMERS
    fix = f'`pip install -U "transformers>={MIN_TRANSFORMERS}"`'
    assert fix in render_directory_card(tmp_path) and fix in render_model_card({"preset": "gmm", "base": "bart"})
    assert f"transformers {MIN_TRANSFORMERS} or newer" in render_model_card({"preset": "rela-g", "base": "marian"})


def test_the_docs_table_is_what_the_record_gives(monkeypatch):
    from conftest import load_script

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    script = load_script("write_transformers_table")
    record = read_record()
    assert [r["transformers"] for r in record["rows"]] == list(ALL_VERSIONS), f"run {RECORD_COMMAND}"
    assert record["settings"]["floor"] == MIN_TRANSFORMERS and record["library"]["transformers"] == LIBRARY_LOW
    page = (ROOT / script.PAGE).read_text(encoding="utf-8")
    assert script.with_marked_block(page, script.START, script.END, script.table(record)) == page, (
        "the table differs from the record: python scripts/write_transformers_table.py")
