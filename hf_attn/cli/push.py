"""``hf-attn push DIR REPO_ID``: upload a trained model directory to the Hub."""

from __future__ import annotations

from ..training.hub import push_model_dir
from .flags import OneLineParser

def run(argv) -> int:
    ap = OneLineParser(prog="hf-attn push", description="upload a trained model directory to the Hub")
    ap.add_argument("model_dir")
    ap.add_argument("repo_id")
    ap.add_argument("--private", action="store_true")
    ap.add_argument("--token", default=None)
    ap.add_argument("--revision", default=None)
    ap.add_argument("--commit_message", "--commit-message", default=None)
    a = ap.parse_args(argv)
    info = push_model_dir(a.model_dir, a.repo_id, private=a.private or None, token=a.token,
                          commit_message=a.commit_message, revision=a.revision)
    print(f"pushed {a.model_dir} to {getattr(info, 'commit_url', None) or a.repo_id}")
    return 0
