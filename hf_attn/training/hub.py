"""Upload a trained model directory to the Hub: one commit with config (``auto_map``), the custom code files,
safetensors weights, tokenizer files, generation config, the model card and results.json. Checkpoints,
optimizer states and logs stay local."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub
from huggingface_hub import errors as hub_errors
from huggingface_hub.utils import validate_repo_id

from ..errors import HfAttnInputError
from ..rundir import check_model_files
from .cards import existing_card, write_model_card

UPLOAD_PATTERNS = ["*.json", "*.py", "*.safetensors", "*.spm", "*.model", "*.txt", "README.md", "viewer.html",
                   "viewer_preview.png"]
IGNORE_PATTERNS = ["checkpoint-*", "checkpoint-*/**", ".tmp-checkpoint/**", "runs/**", "*.pt", "*.pth", "*.bin", "training_args.bin",
                   "trainer_state.json", "all_results.json", "train_results.json", "eval_results.json"]
TOKENIZER_FILES = ("tokenizer_config.json",)


def check_model_dir(model_dir: str | Path) -> Path:
    """The files a Hub-ready directory must hold, or one clear error naming the missing one."""
    d = Path(model_dir)
    if not d.is_dir():
        raise HfAttnInputError(f"model directory {str(model_dir)!r} does not exist; give the --output_dir of `hf-attn train`")
    need = ["config.json", "model.safetensors", "generation_config.json", "tokenizer_config.json"]
    missing = [n for n in need if not (d / n).is_file()]
    if missing:
        raise HfAttnInputError(
            f"{str(model_dir)!r} is not a complete model directory (missing {', '.join(missing)}); train it to the "
            "end or save it with model.save_pretrained + tokenizer.save_pretrained"
        )
    try:
        cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except ValueError as e:
        raise HfAttnInputError(f"{str(model_dir)!r}: config.json is not valid JSON ({str(e)[:80]}); re-save the model "
                               "with save_pretrained") from None
    if not isinstance(cfg, dict):
        raise HfAttnInputError(f"{str(model_dir)!r}: config.json holds a JSON {type(cfg).__name__}, not a model config "
                               "(a JSON object); re-save the model with save_pretrained")

    check_model_files(str(d))  # weights truncated by an interrupted copy are not uploaded
    for name in set(cfg.get("auto_map", {}).values()):
        module = name.split("--")[-1].split(".")[0]
        if not (d / f"{module}.py").is_file():
            raise HfAttnInputError(f"{str(model_dir)!r}: config.json auto_map needs {module}.py, which is missing; re-save the model")
    return d


def push_model_dir(model_dir: str | Path, repo_id: str, private: bool | None = None, token: str | None = None,
                   commit_message: str | None = None, revision: str | None = None, write_card: bool = True):
    """Create the repo (if needed) and upload the directory in one commit; returns the commit info."""
    d = check_model_dir(model_dir)
    if "/" not in repo_id and not repo_id.strip():
        raise HfAttnInputError("REPO_ID is empty; give 'user/name'")
    check_repo_id(repo_id, "REPO_ID")
    if write_card:  # also brings the hf-attn card back over one that transformers' Trainer wrote

        if existing_card(d)[0] != "other":
            write_model_card(d, repo_id)
    api = huggingface_hub.HfApi(token=token)  # (looked up at call time: tests replace it)
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        repo_id = getattr(repo, "repo_id", repo_id)
        return api.upload_folder(folder_path=str(d), repo_id=repo_id, repo_type="model", revision=revision,
                                 commit_message=commit_message or f"Upload hf-attn model {d.name}",
                                 allow_patterns=UPLOAD_PATTERNS, ignore_patterns=IGNORE_PATTERNS)
    except Exception as e:  # noqa: BLE001 - the Hub's errors come in many classes (huggingface_hub's, httpx's)
        problem = hub_problem(e)
        if problem is None:
            raise
        raise HfAttnInputError(f"cannot push {str(model_dir)!r} to {repo_id!r}: {problem}") from None


def check_repo_id(repo_id: str, flag: str) -> None:
    """One line for a repo id the Hub would refuse (``flag`` names where it came from), before anything is written."""
    try:
        validate_repo_id(repo_id)
    except hub_errors.HFValidationError:
        raise HfAttnInputError(f"{flag} {repo_id!r} is not a Hub repo id; give 'user/name' (or 'name'): letters, "
                               "digits, '-', '_' and '.', not starting or ending with '-' or '.', at most 96 "
                               "characters each") from None


def hub_problem(e: Exception) -> str | None:
    """What went wrong talking to the Hub, with the fix, as part of one line; None for another error."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if isinstance(e, hub_errors.OfflineModeIsEnabled):
        return "the Hub is offline here (HF_HUB_OFFLINE=1); run it again without HF_HUB_OFFLINE, where the Hub is " \
               "reachable"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, hub_errors.LocalTokenNotFoundError) or status in (401, 403):
        return (f"not allowed ({first}); log in with `hf auth login` or give --token, a token that may write to the "
                "repo")
    if isinstance(e, hub_errors.HfHubHTTPError):
        return f"the Hub refused it ({first}); fix what it says and run it again"
    if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__module__.split(".")[0] in ("httpx", "httpx2",
                                                                                              "requests", "urllib3"):
        return f"the Hub cannot be reached ({type(e).__name__}: {first}); check the network and run it again"
    return None
