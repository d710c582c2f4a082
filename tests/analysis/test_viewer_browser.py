"""The attention viewer in a real browser: headless Chromium driven over the DevTools protocol on a pipe (`Chromium`
of scripts/viewer_screenshots.py, standard library only). Skipped only when no Chromium is installed (`.ci/run`
installs Debian's `chromium` package)."""

from __future__ import annotations

import pytest
from conftest import load_script
from viewer_helpers import VARIANT_PRESETS, tiny_viewer_data

from hf_attn.analysis import viewer

chromium = load_script("viewer_screenshots")  # its browser driver
pytestmark = [pytest.mark.slow,  # a Chromium process per test
              pytest.mark.skipif(chromium.find_chromium() is None,
                                 reason="no Chromium on PATH (apt-get install -y chromium; .ci/run installs it)")]

# a fingerprint of what the first heat map shows, and how many of its pixels are not white
CANVAS = """(() => {
  const c = document.querySelector('.panel canvas.heatmap');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0, hash = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i] < 250 || d[i + 1] < 250 || d[i + 2] < 250) ink++;
    hash = (hash * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) % 1000000007;
  }
  return {ink, hash, size: [c.width, c.height]};
})()"""


def choose(page, control: str, value) -> None:
    """Pick ``value`` in the <select id=control> as a user would: set it and fire `change`."""
    page.evaluate(f"(() => {{ const s = document.getElementById('{control}'); s.value = '{value}'; "
                  "s.dispatchEvent(new Event('change')); })()")


@pytest.fixture(scope="module")
def browser():
    with chromium.Chromium(width=1400, height=1000) as b:
        yield b


def open_viewer(browser, tmp_path, name, data):
    path = tmp_path / f"{name}.html"
    path.write_text(viewer.render_html(data, name), encoding="utf-8")
    page = browser.open(path)
    page.wait_for("document.body.dataset.ready === 'true' || document.body.dataset.ready === 'error'")
    assert page.evaluate("document.body.dataset.ready") == "true", page.evaluate("document.getElementById('error').textContent")
    return page


def test_side_by_side_renders_and_follows_the_controls(browser, tmp_path):
    page = open_viewer(browser, tmp_path, "side", tiny_viewer_data("softmax", "rela-g", sentences=3))
    assert page.evaluate("[...document.querySelectorAll('.panel h2')].map(h => h.textContent)") == ["softmax", "rela-g"]
    assert page.evaluate("document.querySelectorAll('.panel canvas.heatmap').length") == 2
    first = page.evaluate(CANVAS)
    assert first["ink"] > 1000, first  # the heat map is drawn, not blank
    seen = [first["hash"]]
    for control, value in (("sentence", 1), ("layer", 1), ("head", 2), ("site", "encoder"), ("site", "decoder")):
        choose(page, control, value)
        now = page.evaluate(CANVAS)
        assert now["ink"] > 500, (control, value, now)
        assert now["hash"] not in seen, f"picking {control} {value} did not change the heat map"
        seen.append(now["hash"])
    # the text follows the sentence, and hovering a cell shows its value
    assert "und gott sprach" in page.evaluate("document.getElementById('texts').textContent")
    tip = page.evaluate("""(() => {
      const c = document.querySelector('.panel canvas.heatmap'), g = c._geometry, r = c.getBoundingClientRect();
      c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + g.x0 + g.cell / 2, clientY: r.top + g.y0 + g.cell / 2}));
      const t = document.getElementById('tooltip'); return t.hidden ? null : t.textContent; })()""")
    assert tip and "\u2192" in tip, tip
    # clicking a head in the summary strip selects it
    page.evaluate("document.querySelector('.panel table.summary tr[data-head=\"0\"]').click()")
    assert page.evaluate("document.getElementById('head').value") == "0"
    assert page.errors == []
    assert {r for r in page.requests if not r.startswith("file://")} == set()  # no network


@pytest.mark.parametrize("preset", sorted(set(VARIANT_PRESETS.values())))
def test_every_variant_renders_every_view_without_errors(browser, tmp_path, preset):
    page = open_viewer(browser, tmp_path, preset, tiny_viewer_data(preset, sentences=2))
    views = page.evaluate("""(async () => {
      const out = [], pick = (id, v) => { const s = document.getElementById(id); s.value = String(v);
        s.dispatchEvent(new Event('change')); };
      for (const site of [...document.getElementById('site').options].map(o => o.value)) {
        pick('site', site);
        for (const layer of [...document.getElementById('layer').options].map(o => o.value)) {
          pick('layer', layer);
          for (const head of [...document.getElementById('head').options].map(o => o.value)) {
            pick('head', head);
            const maps = document.querySelector('.panel select.map');
            for (const map of maps ? [...maps.options].map(o => o.value) : ['weights']) {
              if (maps) { const m = document.querySelector('.panel select.map'); m.value = map;
                m.dispatchEvent(new Event('change')); }
              out.push([site, layer, head, map, document.querySelectorAll('canvas').length]);
            }
          }
        }
      }
      return out; })()""")
    assert len(views) >= 3 * 2 * 5
    assert page.errors == []
    # the legend names Gaussian components only on a page that draws some
    assert page.evaluate("document.getElementById('legend-components').hidden") == (preset != "gmm")
    if preset in ("ran-all", "synthesizer"):  # the learned position map is drawn beside the attention
        choose(page, "site", "encoder")
        assert page.evaluate("document.querySelectorAll('.panel canvas.positions').length") == 1
    if preset == "gmm":  # a head shows its components (red dots) on top of the heat map
        choose(page, "site", "cross")
        choose(page, "head", 0)
        red = page.evaluate("""(() => { const c = document.querySelector('.panel canvas.heatmap');
          const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
          for (let i = 0; i < d.length; i += 4) if (d[i] > 180 && d[i + 1] < 80 && d[i + 2] < 80) n++; return n; })()""")
        assert red > 20


@pytest.fixture(scope="module")
def stock_dirs(tmp_path_factory):
    """Plain transformers directories (stock Marian, stock BART, tokenizer beside each), and the stock Marian
    converted to rela-g with `swap_attention` (the same tokenizer): a user's baseline and their variant."""
    from viewer_helpers import stock_model_dir

    from hf_attn import swap_attention

    root = tmp_path_factory.mktemp("stock")
    dirs = {base: stock_model_dir(base, root / f"stock-{base}", root / "tokenizers") for base in ("marian", "bart")}
    variant = swap_attention(str(dirs["marian"]), "rela-g")
    variant.save_pretrained(root / "rela-g")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        (root / "rela-g" / name).write_bytes((dirs["marian"] / name).read_bytes())
    dirs["rela-g"] = root / "rela-g"
    return dirs


@pytest.mark.parametrize("models", [["marian"], ["bart"], ["marian", "rela-g"]])
def test_stock_directories_render_their_softmax_maps(browser, tmp_path, stock_dirs, models):
    """`hf-attn view` on a stock save_pretrained directory (which loads with SDPA, returning no weights) shows its
    softmax maps at every site, alone and beside a variant."""
    from hf_attn.cli import main

    out = tmp_path / "stock.html"
    assert main(["view", *[str(stock_dirs[m]) for m in models], "--text", "und gott sprach es werde licht",
                 "--output", str(out)]) == 0
    data = viewer.read_viewer_data(out)
    assert [m["preset"] for m in data["models"]] == ["stock", "rela-g"][: len(models)]
    for view in data["sentences"][0]["models"]:
        assert {site: len(layers) for site, layers in view["sites"].items()} == {"encoder": 2, "decoder": 2, "cross": 2}
    page = browser.open(out)
    page.wait_for("document.body.dataset.ready === 'true' || document.body.dataset.ready === 'error'")
    assert page.evaluate("document.body.dataset.ready") == "true", page.evaluate("document.getElementById('error').textContent")
    assert page.evaluate("document.querySelectorAll('.panel canvas.heatmap').length") == len(models)
    for site in ("encoder", "decoder", "cross"):
        choose(page, "site", site)
        assert page.evaluate(CANVAS)["ink"] > 200, site  # drawn, not blank
    assert page.errors == []
