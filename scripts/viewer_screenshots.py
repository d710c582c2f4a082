"""The viewer's documentation screenshots (docs/images/viewer/<family>.png and side-by-side.png).

Trains one small model per variant family on Bible verses (German -> English, 150 steps on the CPU; kept
in --runs_dir and reused), writes each one's viewer with `hf-attn view`'s library function, opens it in headless
Chromium (scripts/headless_chromium.py) on a view that shows the family's overlay, and saves the page as a PNG.

    python scripts/viewer_screenshots.py [--runs_dir runs/viewer-shots] [--output docs/images/viewer] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from headless_chromium import Chromium  # noqa: E402

# family -> (preset, what to show: site, layer (-1 = last), head (-1 = mean; "nullest" = the head with most null
# rows among those that still attend somewhere, so that the picture shows null rows beside live ones), map (None =
# the weights))
FAMILIES = {
    "softmax": ("softmax", "cross", -1, -1, None),
    "rela": ("rela-g", "cross", -1, "nullest", None),
    "gmm": ("gmm", "cross", -1, 0, None),
    "reluformer": ("reluformer", "cross", -1, -1, None),
    "calibration": ("calibration-gate", "cross", -1, 0, "mask m"),
    "ran": ("ran-all", "encoder", -1, -1, None),
}
SIDE_BY_SIDE = ("softmax", "rela-g")

TRAIN_ARGS = [
    "--source", "de", "--target", "en", "--max_train_samples", "4000", "--max_eval_samples", "32",
    "--max_predict_samples", "16", "--vocab_size", "1000", "--d_model", "64", "--encoder_layers", "2",
    "--decoder_layers", "2", "--encoder_attention_heads", "4", "--decoder_attention_heads", "4",
    "--encoder_ffn_dim", "128", "--decoder_ffn_dim", "128", "--per_device_train_batch_size", "16",
    "--warmup_steps", "30", "--learning_rate", "3e-3", "--max_source_length", "48", "--max_target_length", "48",
    "--generation_max_new_tokens", "40", "--num_beams", "1", "--save_strategy", "no", "--eval_strategy", "no",
    "--logging_steps", "50", "--disable_tqdm", "true",
]


def train(preset: str, runs_dir: Path, steps: int) -> Path:
    """A small model of ``preset`` (trained once; an existing run directory is reused)."""
    from hf_attn.cli import main

    out = runs_dir / preset
    if (out / "results.json").is_file():
        return out
    rc = main(["train", "--preset", preset, *TRAIN_ARGS, "--max_steps", str(steps), "--output_dir", str(out)])
    if rc != 0:
        raise SystemExit(f"training {preset} failed (exit {rc})")
    return out


def shortest_sentence(data: dict, limit: int = 18) -> int:
    """The index of the longest sentence whose source has at most ``limit`` tokens (else the shortest one)."""
    lengths = [len(s["models"][0]["source_tokens"]) for s in data["sentences"]]
    fitting = [i for i, n in enumerate(lengths) if n <= limit]
    return max(fitting, key=lambda i: lengths[i]) if fitting else min(range(len(lengths)), key=lengths.__getitem__)


def shoot(browser: Chromium, page_path: Path, png: Path, site: str, layer: int, head, map_name) -> None:
    from hf_attn.analysis.viewer import read_viewer_data

    data = read_viewer_data(page_path)
    sentence = shortest_sentence(data)
    layers = data["sentences"][sentence]["models"][0]["sites"][site]
    layer = layer % len(layers)
    if head == "nullest":
        rates = layers[layer]["stats"]["null_rate"]
        live = [h for h in range(len(rates)) if rates[h] < 1] or list(range(len(rates)))  # (a head all null: blank)
        head = max(live, key=rates.__getitem__)
    page = browser.open(page_path)
    page.wait_for("document.body.dataset.ready === 'true'")
    for control, value in (("sentence", sentence), ("site", site), ("layer", layer), ("head", head)):
        page.evaluate(f"(() => {{ const s = document.getElementById('{control}'); s.value = {json.dumps(str(value))}; "
                      "s.dispatchEvent(new Event('change')); })()")
    if map_name:
        page.evaluate("(() => { const s = document.querySelector('.panel select.map'); "
                      f"s.value = {json.dumps(map_name)}; s.dispatchEvent(new Event('change')); }})()")
    page.evaluate("document.getElementById('controls').style.position = 'static'")
    page.screenshot(png)
    if page.errors:
        raise SystemExit(f"{page_path}: the page reported errors: {page.errors}")
    print(f"wrote {png}")


def main(argv=None) -> int:
    from hf_attn.analysis.viewer import write_viewer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs_dir", type=Path, default=Path("runs/viewer-shots"))
    ap.add_argument("--output", type=Path, default=Path("docs/images/viewer"))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--sentences", type=int, default=8)
    a = ap.parse_args(argv)
    a.output.mkdir(parents=True, exist_ok=True)
    runs = {preset: train(preset, a.runs_dir, a.steps) for preset, *_ in FAMILIES.values()}
    with Chromium(width=1280, height=900) as browser:
        for family, (preset, site, layer, head, map_name) in FAMILIES.items():
            page = write_viewer([runs[preset]], a.runs_dir / f"{family}.html", a.sentences, progress=False)
            shoot(browser, page, a.output / f"{family}.png", site, layer, head, map_name)
        page = write_viewer([runs[p] for p in SIDE_BY_SIDE], a.runs_dir / "side-by-side.html", a.sentences,
                            progress=False)
        shoot(browser, page, a.output / "side-by-side.png", "cross", -1, -1, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
