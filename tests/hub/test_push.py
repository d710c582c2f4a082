"""Hub upload, offline: `hf-attn push` and `model.push_to_hub` against a recording fake of the Hub API.

The fake keeps what a real Hub would store (one folder per repo, one record per call), so the tests check the
upload's contents and then load those files in a fresh process that cannot import hf_attn.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from training_helpers import train_tiny

from hf_attn.cli import main


class FakeHubApi:
    """Records create_repo / create_commit / upload_folder / create_branch calls and stores the files per repo."""

    def __init__(self, root: Path):
        self.root = root
        self.calls: list[tuple[str, dict]] = []

    def repo_dir(self, repo_id: str) -> Path:
        return self.root / repo_id.replace("/", "__")

    def create_repo(self, repo_id, private=None, exist_ok=False, repo_type=None, token=None, **kw):
        if "/" not in repo_id:
            repo_id = f"fake-user/{repo_id}"
        self.calls.append(("create_repo", {"repo_id": repo_id, "private": private, "exist_ok": exist_ok}))
        self.repo_dir(repo_id).mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(repo_id=repo_id)

    def create_branch(self, repo_id, branch, **kw):
        self.calls.append(("create_branch", {"repo_id": repo_id, "branch": branch}))

    def create_commit(self, repo_id, operations, commit_message=None, revision=None, **kw):
        if "/" not in repo_id:
            repo_id = f"fake-user/{repo_id}"
        paths = []
        for op in operations:
            dest = self.repo_dir(repo_id) / op.path_in_repo
            dest.parent.mkdir(parents=True, exist_ok=True)
            src = op.path_or_fileobj
            if isinstance(src, (str, Path)):
                shutil.copyfile(src, dest)
            elif isinstance(src, bytes):
                dest.write_bytes(src)
            else:
                dest.write_bytes(src.read())
            paths.append(op.path_in_repo)
        self.calls.append(("create_commit", {"repo_id": repo_id, "paths": sorted(paths), "message": commit_message,
                                             "revision": revision}))
        return SimpleNamespace(commit_url=f"https://fake.hub/{repo_id}/commit/1", oid="1")

    def upload_folder(self, folder_path, repo_id, allow_patterns=None, ignore_patterns=None, commit_message=None,
                      revision=None, **kw):
        from huggingface_hub import CommitOperationAdd
        from huggingface_hub.utils import filter_repo_objects

        folder = Path(folder_path)
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        chosen = list(filter_repo_objects(files, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns))
        ops = [CommitOperationAdd(path_in_repo=f, path_or_fileobj=str(folder / f)) for f in chosen]
        return self.create_commit(repo_id, ops, commit_message=commit_message, revision=revision)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    import huggingface_hub
    import transformers.utils.hub as tf_hub
    from huggingface_hub.errors import EntryNotFoundError

    api = FakeHubApi(tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: api)
    monkeypatch.setattr(tf_hub, "_hf_api", api)

    def no_card(*a, **k):  # a new repo has no README yet
        raise EntryNotFoundError("no README.md in the fake repo")

    monkeypatch.setattr(tf_hub.ModelCard, "load", no_card)
    return api


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("hubrun") / "rela-g", cache_dir=tmp_path_factory.mktemp("tok"))


TRANSLATE_IN_FRESH_PROCESS = textwrap.dedent(
    """
    import json, sys, importlib.abc
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_attn" or name.startswith("hf_attn."):
                raise ImportError("hf_attn must not be importable here")
    sys.meta_path.insert(0, Block())
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    repo, texts, max_new = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    model = AutoModelForSeq2SeqLM.from_pretrained(repo, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    tok = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)  # as the model card says
    out = []
    with torch.no_grad():
        for t in texts:  # one at a time: no padding differences with the trainer's batched decoding
            enc = tok([t], return_tensors="pt", truncation=True, max_length=64)
            gen = model.generate(**enc, max_length=max_new + 2)
            out.append(tok.batch_decode(gen, skip_special_tokens=True)[0].strip())
    print("RESULT " + json.dumps(out))
    """
)


def _translate_fresh(repo: Path, texts: list[str], max_new: int, tmp_path: Path) -> list[str]:
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "-c", TRANSLATE_IN_FRESH_PROCESS, str(repo), json.dumps(texts), str(max_new)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Do you wish to run the custom code" not in p.stdout + p.stderr  # the card's snippet never prompts
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    return json.loads(line[-1][len("RESULT "):])


@pytest.mark.slow
def test_cli_push_uploads_a_loadable_model(trained, fake_hub, tmp_path, capsys):
    assert main(["push", str(trained), "someone/tiny-rela-g", "--private"]) == 0
    assert "pushed" in capsys.readouterr().out
    kinds = [c[0] for c in fake_hub.calls]
    assert kinds == ["create_repo", "create_commit"], kinds  # one commit
    assert fake_hub.calls[0][1] == {"repo_id": "someone/tiny-rela-g", "private": True, "exist_ok": True}
    uploaded = set(fake_hub.calls[1][1]["paths"])
    cfg = json.loads((trained / "config.json").read_text())
    code = {ref.split(".")[0] + ".py" for ref in cfg["auto_map"].values()}
    code |= {p.name for p in trained.glob("*.py")}
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json", "vocab.json",
                 "source.spm", "target.spm", "README.md", "results.json", *code):
        assert name in uploaded, name
    assert {"attention_base.py", "registry.py", "attention_rela.py", "modeling_hf_attn.py"} <= uploaded
    assert not any(p.startswith("checkpoint-") or p.endswith((".bin", ".pt")) for p in uploaded), uploaded
    assert "trainer_state.json" not in uploaded
    repo = fake_hub.repo_dir("someone/tiny-rela-g")
    card = (repo / "README.md").read_text()
    assert "someone/tiny-rela-g" in card and "AutoTokenizer.from_pretrained(repo, trust_remote_code=True)" in card
    # the uploaded files load in a process that cannot import hf_attn and translate like the trained model
    from hf_attn.data import read_bible_pair

    texts = [x["translation"]["de"] for x in read_bible_pair("e", "4")["test"][:3]]
    ours = _translate_locally(trained, texts)
    assert _translate_fresh(repo, texts, 16, tmp_path) == ours


def _translate_locally(model_dir: Path, texts: list[str]) -> list[str]:
    from hf_attn.rundir import load_model_dir

    model, tok = load_model_dir(str(model_dir))
    out = []
    with torch.no_grad():
        for t in texts:
            enc = tok([t], return_tensors="pt", truncation=True, max_length=64)
            gen = model.generate(**enc, max_length=18)
            out.append(tok.batch_decode(gen, skip_special_tokens=True)[0].strip())
    return out


@pytest.mark.slow
def test_model_push_to_hub(fake_hub, tmp_path):
    from conftest import tiny_batch, tiny_model

    model = tiny_model("bart", "rela-g")
    model.push_to_hub("someone/tiny-bart-rela-g")
    commits = [c for c in fake_hub.calls if c[0] == "create_commit"]
    assert len(commits) == 1
    uploaded = set(commits[0][1]["paths"])
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md", "configuration_hf_attn.py",
            "modeling_hf_attn.py", "attention_base.py", "attention_rela.py", "registry.py"} <= uploaded
    repo = fake_hub.repo_dir("someone/tiny-bart-rela-g")
    cfg = json.loads((repo / "config.json").read_text())
    assert cfg["model_type"] == "hf_attn_bart" and "AutoModelForSeq2SeqLM" in cfg["auto_map"]
    # same logits from the uploaded files in a process without hf_attn
    from test_presets import FRESH_LOADER

    b = tiny_batch()
    batch = {k: b[k] for k in ("input_ids", "attention_mask")} | {"decoder_input_ids": b["labels"].clamp(min=3)}
    torch.save(batch, tmp_path / "batch.pt")
    with torch.no_grad():
        expected = model(**batch).logits
    job = [{"dir": str(repo), "batch": str(tmp_path / "batch.pt"), "out": str(tmp_path / "fresh.pt")}]
    env = {"HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", FRESH_LOADER, json.dumps(job)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "fresh.pt")["logits"], expected, rtol=0, atol=1e-6)


def test_push_rejects_an_incomplete_directory(tmp_path, fake_hub, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert main(["push", str(tmp_path / "half"), "someone/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing model.safetensors" in err[0]
    assert fake_hub.calls == []
