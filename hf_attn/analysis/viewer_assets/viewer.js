// hf-attn attention viewer: draws the data embedded by hf_attn.analysis.viewer (no network, no library).
// Weights arrive as integers round(w * scale); 0 means exactly zero (a nonzero weight is stored as at least +-1).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const SITE_NAMES = { encoder: "encoder self-attention", decoder: "decoder self-attention", cross: "cross-attention" };
  const WEIGHTS = "weights";
  const state = { sentence: 0, site: "cross", layer: 0, head: -1, maps: {} };
  let DATA = null;

  // ---- data ------------------------------------------------------------------------------------------------------
  async function loadData() {
    const b64 = $("viewer-data").textContent.trim();
    const binary = atob(b64);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser has no DecompressionStream to unpack the data: open the file in a current " +
        "Chrome, Edge, Firefox (113+) or Safari (16.4+)");
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return JSON.parse(await new Response(stream).text());
  }

  const fmt = (x, digits = 3) => (x === null || x === undefined ? "-" : Number(x).toFixed(digits));

  function valueText(q) {
    // q: the stored integer (or a mean of them)
    if (q === 0) return "exactly 0";
    const v = q / DATA.scale;
    if (Math.abs(q) <= 1 && Number.isInteger(q)) return (v > 0 ? "< 0.001 (not 0)" : "> -0.001 (not 0)");
    return v.toFixed(3);
  }

  // the matrix [T][S] of the current head, or the mean over heads; zero only where every head is exactly 0
  function pickHead(stack, head) {
    if (head >= 0) return stack[Math.min(head, stack.length - 1)];
    const rows = stack[0].length, cols = rows ? stack[0][0].length : 0;
    const out = [];
    for (let i = 0; i < rows; i++) {
      const row = new Array(cols).fill(0);
      for (let j = 0; j < cols; j++) {
        let sum = 0;
        for (let h = 0; h < stack.length; h++) sum += stack[h][i][j];
        row[j] = sum / stack.length;
      }
      out.push(row);
    }
    return out;
  }

  // ---- colours ---------------------------------------------------------------------------------------------------
  const BLUES = [[222, 235, 247], [158, 202, 225], [66, 146, 198], [8, 81, 156], [8, 48, 107]];
  const REDS = [[254, 224, 210], [252, 146, 114], [222, 45, 38], [165, 15, 21]];
  const ORANGES = [[254, 230, 206], [253, 141, 60], [166, 54, 3]];
  const GREENS = [[229, 245, 224], [116, 196, 118], [0, 109, 44]];
  const PURPLES = [[239, 237, 245], [158, 154, 200], [84, 39, 143]];

  function ramp(stops, t) {
    t = Math.max(0, Math.min(1, t));
    const x = t * (stops.length - 1), k = Math.min(Math.floor(x), stops.length - 2), f = x - k;
    const c = stops[k].map((a, n) => Math.round(a + f * (stops[k + 1][n] - a)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // ---- heat map --------------------------------------------------------------------------------------------------
  function drawHeatmap(canvas, spec) {
    // spec: {matrix, rowLabels, colLabels, hidden(i,j), nullRows[i] (0..1 share of heads), palette, vmax,
    //        side: [{label, values[i], palette, vmax}], components: [[{mu, sigma, weight}]] | null}
    const ctx0 = canvas.getContext("2d");
    ctx0.font = "11px system-ui, sans-serif";
    const rows = spec.matrix.length, cols = rows ? spec.matrix[0].length : spec.colLabels.length;
    const cell = Math.max(8, Math.min(22, Math.floor(560 / Math.max(rows, cols, 1))));
    const labelW = Math.min(150, 14 + Math.max(20, ...spec.rowLabels.map((s) => ctx0.measureText(s).width)));
    const topH = Math.min(120, 10 + Math.max(20, ...spec.colLabels.map((s) => ctx0.measureText(s).width)) * 0.87);
    const sideW = spec.side.length ? 8 + spec.side.length * (cell + 4) : 0;
    const width = labelW + cols * cell + sideW + topH * 0.55 + 8, height = topH + rows * cell + 8;
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.ceil(width * ratio);
    canvas.height = Math.ceil(height * ratio);
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    const x0 = labelW, y0 = topH;
    for (let i = 0; i < rows; i++) {
      for (let j = 0; j < cols; j++) {
        if (spec.hidden(i, j)) continue;
        const q = spec.matrix[i][j], x = x0 + j * cell, y = y0 + i * cell;
        if (q === 0) {
          ctx.fillStyle = "#f1f1f1";
          ctx.fillRect(x, y, cell - 1, cell - 1);
          ctx.strokeStyle = "#c9c9c9";
          ctx.beginPath();
          ctx.moveTo(x + 1, y + cell - 2);
          ctx.lineTo(x + cell - 2, y + 1);
          ctx.stroke();
        } else {
          const t = Math.abs(q) / spec.vmax;
          ctx.fillStyle = q > 0 ? ramp(spec.palette, t) : ramp(ORANGES, t);
          ctx.fillRect(x, y, cell - 1, cell - 1);
        }
      }
    }
    // null rows: outlined in red and marked, never drawn as a uniform row
    ctx.textBaseline = "middle";
    for (let i = 0; i < rows; i++) {
      const share = spec.nullRows ? spec.nullRows[i] : 0;
      const y = y0 + i * cell;
      ctx.textAlign = "right";
      ctx.fillStyle = share >= 1 ? "#c00000" : "#222";
      ctx.fillText((share >= 1 ? "\u2205 " : share > 0 ? "\u2218 " : "") + spec.rowLabels[i], x0 - 4, y + cell / 2);
      if (share >= 1) {
        ctx.strokeStyle = "#c00000";
        ctx.lineWidth = 1.5;
        ctx.strokeRect(x0 + 0.5, y + 0.5, cols * cell - 2, cell - 2);
        ctx.lineWidth = 1;
      }
    }
    // column labels, rotated
    ctx.textAlign = "left";
    ctx.fillStyle = "#222";
    for (let j = 0; j < cols; j++) {
      ctx.save();
      ctx.translate(x0 + j * cell + cell / 2, y0 - 4);
      ctx.rotate(-Math.PI / 3);
      ctx.fillText(spec.colLabels[j], 0, 0);
      ctx.restore();
    }
    // side columns (gate, row sums)
    spec.side.forEach((col, c) => {
      const x = x0 + cols * cell + 8 + c * (cell + 4);
      ctx.save();
      ctx.translate(x + cell / 2, y0 - 4);
      ctx.rotate(-Math.PI / 3);
      ctx.fillStyle = "#444";
      ctx.fillText(col.label, 0, 0);
      ctx.restore();
      for (let i = 0; i < rows; i++) {
        const v = col.values[i];
        if (v === null || v === undefined) continue;
        ctx.fillStyle = v === 0 ? "#f1f1f1" : ramp(col.palette, Math.abs(v) / col.vmax);
        ctx.fillRect(x, y0 + i * cell, cell - 1, cell - 1);
      }
    });
    // GMM components: a dot at mu (size by weight) and a bar of +- sigma, per target row
    if (spec.components) {
      ctx.strokeStyle = "#d62728";
      ctx.fillStyle = "#d62728";
      spec.components.forEach((comps, i) => {
        const yc = y0 + i * cell + cell / 2;
        comps.forEach((k) => {
          const xc = x0 + (k.mu + 0.5) * cell;
          const left = Math.max(x0, xc - k.sigma * cell), right = Math.min(x0 + cols * cell, xc + k.sigma * cell);
          ctx.beginPath();
          ctx.moveTo(left, yc);
          ctx.lineTo(right, yc);
          ctx.stroke();
          ctx.beginPath();
          ctx.arc(Math.min(Math.max(xc, x0), x0 + cols * cell), yc, 1.5 + Math.sqrt(k.weight) * cell * 0.3, 0, 2 * Math.PI);
          ctx.fill();
        });
      });
    }
    canvas._geometry = { x0, y0, cell, rows, cols, sideX: x0 + cols * cell + 8, side: spec.side.length };
    canvas._spec = spec;
  }

  function hoverText(canvas, ev) {
    const g = canvas._geometry, spec = canvas._spec;
    if (!g) return null;
    const rect = canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const i = Math.floor((y - g.y0) / g.cell);
    if (i < 0 || i >= g.rows) return null;
    const lines = [];
    const j = Math.floor((x - g.x0) / g.cell);
    if (x >= g.x0 && j < g.cols) {
      if (spec.hidden(i, j)) return `${spec.rowLabels[i]} \u2192 ${spec.colLabels[j]}: not visible (a later position)`;
      lines.push(`${spec.rowLabels[i]} \u2192 ${spec.colLabels[j]}: ${valueText(spec.matrix[i][j])}`);
    } else if (x >= g.sideX) {
      const c = Math.floor((x - g.sideX) / (g.cell + 4));
      if (c >= g.side) return null;
      const col = spec.side[c];
      lines.push(`${spec.rowLabels[i]}: ${col.label} ${fmt(col.values[i])}`);
    } else {
      lines.push(spec.rowLabels[i]);
    }
    if (spec.nullRows && spec.nullRows[i] > 0) {
      lines.push(spec.nullRows[i] >= 1 ? "null row: every weight is exactly 0"
        : `null in ${Math.round(spec.nullRows[i] * spec.heads)} of ${spec.heads} heads`);
    }
    if (spec.components && spec.components[i]) {
      spec.components[i].forEach((k, n) => lines.push(`component ${n + 1}: mu ${fmt(k.mu, 2)}, sigma ${fmt(k.sigma, 2)}, ` +
        `weight ${fmt(k.weight, 2)}`));
    }
    spec.side.forEach((col) => { if (x < g.sideX) lines.push(`${col.label}: ${fmt(col.values[i])}`); });
    return lines.join("\n");
  }

  function attachTooltip(canvas) {
    const tip = $("tooltip");
    canvas.addEventListener("mousemove", (ev) => {
      const text = hoverText(canvas, ev);
      if (!text) { tip.hidden = true; return; }
      tip.textContent = text;
      tip.hidden = false;
      tip.style.left = `${ev.clientX + 14}px`;
      tip.style.top = `${ev.clientY + 14}px`;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  }

  // ---- page --------------------------------------------------------------------------------------------------------
  function el(tag, attrs = {}, text = "") {
    const e = document.createElement(tag);
    Object.entries(attrs).forEach(([k, v]) => e.setAttribute(k, v));
    if (text) e.textContent = text;
    return e;
  }

  function fillSelect(select, options, value) {
    select.replaceChildren(...options.map(([v, label]) => el("option", { value: String(v) }, label)));
    select.value = String(value);
  }

  function sitesOf(sentence) {
    return Object.keys(SITE_NAMES).filter((s) => sentence.models.some((m) => m.sites[s]));
  }

  function setupControls() {
    const shorten = (s) => (s.length > 70 ? s.slice(0, 67) + "..." : s);
    fillSelect($("sentence"), DATA.sentences.map((s, n) => [n, `${n + 1}. ${shorten(s.source)}`]), state.sentence);
    const sites = sitesOf(DATA.sentences[0]);
    if (!sites.includes(state.site)) state.site = sites[0];
    fillSelect($("site"), sites.map((s) => [s, SITE_NAMES[s]]), state.site);
    updateLayerHead();
    $("sentence").addEventListener("change", (e) => { state.sentence = Number(e.target.value); render(); });
    $("site").addEventListener("change", (e) => { state.site = e.target.value; updateLayerHead(); render(); });
    $("layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); render(); });
    $("head").addEventListener("change", (e) => { state.head = Number(e.target.value); render(); });
  }

  function updateLayerHead() {
    const views = DATA.sentences[state.sentence].models.map((m) => m.sites[state.site]).filter(Boolean);
    const layers = Math.max(...views.map((v) => v.length));
    const heads = Math.max(...views.map((v) => v[0].weights.length));
    state.layer = Math.min(state.layer, layers - 1);
    state.head = Math.min(state.head, heads - 1);
    fillSelect($("layer"), [...Array(layers).keys()].map((l) => [l, `layer ${l + 1} of ${layers}`]), state.layer);
    fillSelect($("head"), [[-1, "mean over heads"], ...[...Array(heads).keys()].map((h) => [h, `head ${h + 1}`])],
      state.head);
  }

  function renderTexts(sentence) {
    const box = $("texts");
    const line = (label, text) => {
      const p = el("p");
      p.append(el("span", { class: "label" }, label), document.createTextNode(text));
      return p;
    };
    box.replaceChildren(line("source", sentence.source));
    if (sentence.reference) box.append(line("reference", sentence.reference));
    sentence.models.forEach((m, n) => box.append(line(`translation (${DATA.models[n].name})`, m.translation)));
    box.append(line("attention shown for", sentence.forced_on === "reference"
      ? "the reference (teacher forcing): row t is the step that predicts target token t"
      : "each model's own translation (teacher forcing): row t is the step that predicts token t"));
  }

  function axisLabels(view, site) {
    const target = view.target_tokens.map((t) => `\u2192 ${t}`);
    if (site === "encoder") return { rows: view.source_tokens, cols: view.source_tokens };
    if (site === "decoder") return { rows: target, cols: view.decoder_tokens };
    return { rows: target, cols: view.source_tokens };
  }

  function renderPanel(n, view) {
    const info = DATA.models[n];
    const panel = el("div", { class: "panel", "data-model": info.name });
    panel.append(el("h2", {}, `${info.name}`));
    const layers = view.sites[state.site];
    const layer = layers ? layers[state.layer] : null;
    if (!layer) {
      panel.append(el("p", { class: "missing" }, `no ${SITE_NAMES[state.site]} layer ${state.layer + 1} in this model`));
      return panel;
    }
    const heads = layer.weights.length, head = Math.min(state.head, heads - 1);
    panel.append(el("p", { class: "variant" }, `preset ${info.preset}; ${SITE_NAMES[state.site]} layer ` +
      `${state.layer + 1}: ${layer.variant}`));
    const mapNames = [WEIGHTS, ...Object.keys(layer.maps)];
    let map = state.maps[n] && mapNames.includes(state.maps[n]) ? state.maps[n] : WEIGHTS;
    if (mapNames.length > 1) {
      const select = el("select", { class: "map" });
      fillSelect(select, mapNames.map((m) => [m, m === WEIGHTS ? (layer.weights_label || "attention weights") : m]), map);
      select.addEventListener("change", (e) => { state.maps[n] = e.target.value; render(); });
      const label = el("label", {}, "map ");
      label.append(select);
      panel.append(label);
    }
    const stack = map === WEIGHTS ? layer.weights : layer.maps[map];
    const matrix = pickHead(stack, head);
    const labels = axisLabels(view, state.site);
    const nullRows = layer.null_rows[0].map((_, i) => {
      if (map !== WEIGHTS) return 0;
      if (head >= 0) return layer.null_rows[head][i];
      return layer.null_rows.reduce((a, r) => a + r[i], 0) / heads;
    });
    const side = [];
    const perHead = (values) => (head >= 0 ? values[head] : values[0].map((_, i) =>
      values.reduce((a, r) => a + r[i], 0) / values.length));
    if (layer.gate) side.push({ label: "gate", values: perHead(layer.gate), palette: GREENS, vmax: 1 });
    if (layer.row_sums) {
      const sums = perHead(layer.row_sums);
      side.push({ label: "row sum", values: sums, palette: PURPLES, vmax: Math.max(1e-9, ...sums.map(Math.abs)) });
    }
    let components = null;
    if (layer.components && head >= 0 && (map === WEIGHTS || map.includes("mixture"))) {
      const c = layer.components;
      components = c.mu[head].map((mus, i) => mus.map((mu, k) => ({ mu, sigma: c.sigma[head][i][k], weight: c.weights[head][i][k] })));
    }
    const vmax = Math.max(1, ...matrix.map((r) => Math.max(...r.map(Math.abs))));
    const canvas = el("canvas", { class: "heatmap", "data-map": map });
    drawHeatmap(canvas, {
      matrix, rowLabels: labels.rows, colLabels: labels.cols, nullRows, heads, side, components, vmax,
      palette: map.startsWith("mask") ? REDS : BLUES,
      hidden: (i, j) => state.site === "decoder" && j > i,
    });
    attachTooltip(canvas);
    panel.append(canvas);
    const largest = Math.max(0, ...matrix.map((r) => Math.max(...r.map(Math.abs))));
    const scale = largest === 0 ? "every weight of this map is exactly 0 (hatched)"
      : `darkest = ${(vmax / DATA.scale).toFixed(3)}, the largest weight of this map; hatched = exactly 0`;
    panel.append(el("p", { class: "scale" }, scale + (state.site === "decoder" ? "; blank = a later position" : "")));
    if (layer.components && head < 0) {
      panel.append(el("p", { class: "variant" }, "pick a head to see its Gaussian components (mu, sigma, weight)"));
    }
    panel.append(summaryTable(layer, head));
    const positions = info.position_maps[state.site] && info.position_maps[state.site][String(state.layer)];
    if (positions) {
      panel.append(el("h3", {}, "learned position map (input-independent: the layer's weights on any input of this length)"));
      const pm = pickHead(positions, head);
      const idx = pm.map((_, k) => String(k));
      const pcanvas = el("canvas", { class: "positions" });
      drawHeatmap(pcanvas, { matrix: pm, rowLabels: idx, colLabels: idx, nullRows: null, heads, side: [],
        components: null, vmax: Math.max(1, ...pm.map((r) => Math.max(...r))), palette: BLUES,
        hidden: (i, j) => state.site === "decoder" && j > i });
      attachTooltip(pcanvas);
      panel.append(pcanvas);
    }
    return panel;
  }

  function summaryTable(layer, head) {
    const table = el("table", { class: "summary" });
    const headRow = el("tr");
    ["head", "sparsity", "null rate", "entropy (nats)"].forEach((h) => headRow.append(el("th", {}, h)));
    table.append(headRow);
    const s = layer.stats;
    const maxEntropy = Math.max(1e-9, ...s.entropy.map((x) => x || 0));
    const cellWithBar = (v, max) => {
      const td = el("td");
      const bar = el("span", { class: "bar" });
      bar.style.width = `${Math.round(40 * (v || 0) / max)}px`;
      td.append(bar, document.createTextNode(fmt(v)));
      return td;
    };
    s.sparsity.forEach((_, h) => {
      const tr = el("tr", { class: "head-row" + (h === head ? " current" : ""), "data-head": String(h) });
      tr.append(el("td", {}, `head ${h + 1}`), cellWithBar(s.sparsity[h], 1), cellWithBar(s.null_rate[h], 1),
        cellWithBar(s.entropy[h], maxEntropy));
      tr.addEventListener("click", () => { state.head = h; $("head").value = String(h); render(); });
      table.append(tr);
    });
    const mean = (xs) => xs.reduce((a, x) => a + (x || 0), 0) / xs.length;
    const tr = el("tr", { class: "head-row" + (head < 0 ? " current" : "") });
    tr.append(el("td", {}, "mean"), cellWithBar(mean(s.sparsity), 1), cellWithBar(mean(s.null_rate), 1),
      cellWithBar(mean(s.entropy), maxEntropy));
    tr.addEventListener("click", () => { state.head = -1; $("head").value = "-1"; render(); });
    table.append(tr);
    return table;
  }

  function render() {
    const sentence = DATA.sentences[state.sentence];
    renderTexts(sentence);
    $("panels").replaceChildren(...sentence.models.map((view, n) => renderPanel(n, view)));
    // the GMM legend entry only where a model on the page has Gaussian components to draw
    $("legend-components").hidden = !sentence.models.some((view) =>
      Object.values(view.sites || {}).some((layers) => layers.some((layer) => layer.components)));
    document.body.dataset.renders = String(Number(document.body.dataset.renders || 0) + 1);
  }

  async function main() {
    try {
      DATA = await loadData();
      const names = DATA.models.map((m) => `${m.name} (${m.preset})`).join(" | ");
      $("description").textContent = `${names}; ${DATA.sentences.length} sentence(s)` +
        (DATA.description ? ` from ${DATA.description}` : "");
      setupControls();
      render();
      document.body.dataset.ready = "true";
    } catch (err) {
      $("error").hidden = false;
      $("error").textContent = `The viewer could not start: ${err.message}`;
      document.body.dataset.ready = "error";
      throw err;
    }
  }

  main();
})();
