"""The papers' tables and figures as named statistics of ``hf-attn analyze --figures NAME,...``.

Each figure computes its numbers for one model on the analysed pairs (JSON under ``"figures"``) and, with
``--plot_dir``, draws ``<run>_<figure>.png`` with a title naming the table or figure it reproduces. A figure that
does not apply to a model (a calibration figure on a model without calibrated attention) is recorded as
``{"skipped": reason}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HfAttnInputError
from ..generation import translate_texts
from ..modeling.hyperparameters import did_you_mean
from . import common
from .alignment import alignment_quality, read_pharaoh, word_alignments
from .calibration import calibration_modules, calibration_statistics, kendall_with_gradients
from .gmm import TABLE6_EDGES, entropy_by_length
from .options import NUMBER_LISTS, AnalyzeOptions, option_defaults
from .ran import layer_pair_jsd, plot_histograms, plot_matrices, weight_histograms
from .rela import (
    null_rate_shuffled,
    rank_by_null_rate,
    sentence_null_rates,
    shuffle_demo,
    top_share_hits,
    write_ranking,
)
from .reluformer import layer_entropy_and_mass, long_documents

GMM_BLEU_EDGES = (10, 20, 30, 40, 50)  # GMM Figure 7: 6 sets by source length, (50, inf) the last
RAN_BLEU_EDGES = (10, 20, 30, 40, 50, 60)  # RAN Figure 8: 7 bins by source and by target length


class Skip(Exception):
    """The figure does not apply to this model; the message says why."""


@dataclass
class Context:
    model: object
    tokenizer: object
    name: str  # the run's directory name, for file names and titles
    sources: list
    targets: list
    options: AnalyzeOptions  # batch size, beams, plot directory and the figures' settings
    cache: dict = field(default_factory=dict)

    def batches(self, sources=None, targets=None, max_length: int = 128, desc: str = "batches"):
        return list(common.tokenized_batches(self.tokenizer, sources or self.sources, targets or self.targets,
                                             self.options.batch_size, max_length, self.progress, desc))

    @property
    def progress(self) -> bool:
        return len(self.sources) > 4 * self.options.batch_size

    def once(self, key, compute):
        if key not in self.cache:
            self.cache[key] = compute()
        return self.cache[key]

    def hypotheses(self) -> list[str]:
        o = self.options
        return self.once("hyps", lambda: translate_texts(self.model, self.tokenizer, self.sources,
                                                          num_beams=o.num_beams, batch_size=o.batch_size,
                                                          progress=True, desc=f"translating ({self.name})"))

    def plot(self, figure: str) -> Path | None:
        if not self.options.plot_dir:
            return None
        Path(self.options.plot_dir).mkdir(parents=True, exist_ok=True)
        return Path(self.options.plot_dir) / f"{self.name}_{figure}.png"


def gold(ctx: Context):
    if not ctx.options.gold_alignments:
        raise Skip("needs --gold-alignments FILE (Pharaoh i-j lines, one per analysed pair)")
    return ctx.once("gold", lambda: read_pharaoh(ctx.options.gold_alignments))


# ---- ReLA ------------------------------------------------------------------------------------------------------------
def rela_null_shuffled(ctx: Context) -> dict:
    out = null_rate_shuffled(ctx.model, ctx.tokenizer, ctx.sources, ctx.targets, ctx.options.batch_size,
                             ctx.options.seed)
    if ctx.plot("rela-null-shuffled"):
        series = {f"{site} ({kind})": (list(range(1, len(v) + 1)), v) for kind, sites in out.items() for site, v in sites.items()}
        common.plot_series(series, ctx.plot("rela-null-shuffled"), f"ReLA Figure 6: null rate, true vs shuffled targets "
                           f"({ctx.name})", "layer", "null rate (mean over heads)")
    return out


def rela_rank_null(ctx: Context) -> dict:
    a = ctx.options
    if not a.rank_null and a.shuffle_fraction is None:
        raise Skip("needs --rank-null FILE and/or --shuffle-fraction F")
    sources, targets = ctx.cache.get("rank_pairs", (ctx.sources, ctx.targets))
    flagged, out = [], {"pairs": len(sources), "top": a.top_share}
    if a.shuffle_fraction is not None:
        demo = shuffle_demo(ctx.model, ctx.tokenizer, sources, targets, a.shuffle_fraction, a.top_share, a.seed,
                            a.batch_size, progress=True)
        rates, ranking, targets, flagged = demo.pop("rates"), demo.pop("ranking"), demo.pop("targets"), demo["shuffled_indices"]
        out.update(demo)
        print(f"{ctx.name}: {demo['shuffled_in_top']} of {demo['shuffled']} shuffled pairs in the top "
              f"{a.top_share:.0%} by null rate (chance: {demo['expected_by_chance']:.1f})")
    else:
        rates = sentence_null_rates(ctx.model, ctx.tokenizer, sources, targets, a.batch_size, progress=True)
        ranking = rank_by_null_rate(rates)
    path = a.rank_output or f"{a.rank_null or 'pairs'}.{ctx.name}.null-ranked.tsv"
    write_ranking(path, ranking, rates, sources, targets, flagged)
    out.update({"ranking_file": str(path), "top_null_rates": [rates[i] for i in ranking[:10]],
                "mean_null_rate": sum(rates) / len(rates), "flagged_in_top": top_share_hits(ranking, flagged, a.top_share)})
    print(f"wrote {path}")
    return out


def rela_alignment(ctx: Context) -> dict:
    layer, lines = word_alignments(ctx.model, ctx.tokenizer, ctx.sources, ctx.targets, ctx.options.alignment_layer)
    return {"layer": layer, "shifted": True, "format": "pharaoh source-target", "alignments": lines}


def _aer(ctx: Context, shifted: bool) -> dict:
    pairs = gold(ctx)
    return ctx.once(("aer", shifted), lambda: alignment_quality(ctx.model, ctx.tokenizer, ctx.sources, ctx.targets,
                                                                 pairs, shifted, ctx.progress))


def rela_aer(ctx: Context) -> dict:
    out = {"normal": _aer(ctx, False), "shifted": _aer(ctx, True)}
    if ctx.plot("rela-aer"):
        series = {}
        for kind, res in out.items():
            layers = [r["layer"] + 1 for r in res["layers"]]
            series[f"{kind}, best head"] = (layers, [r["best_head_aer"] for r in res["layers"]])
            series[f"{kind}, layer attention"] = (layers, [r["aer"] for r in res["layers"]])
        common.plot_series(series, ctx.plot("rela-aer"), f"ReLA Figure 4 / Table 5: AER per layer ({ctx.name})",
                           "decoder layer", "AER")
    return out


def _speed_by_length(ctx: Context, figure: str, title: str) -> list[dict]:
    groups = common.equal_count_groups([common.words(s) for s in ctx.sources], ctx.options.speed_groups)
    rows = ctx.once("speed_by_length", lambda: common.speed_by_groups(
        ctx.model, ctx.tokenizer, {f"group {k + 1}": [ctx.sources[i] for i in g] for k, g in enumerate(groups)},
        batch_size=1, num_beams=ctx.options.num_beams, repeats=ctx.options.speed_repeats, progress=True))
    if ctx.plot(figure):
        common.plot_series({ctx.name: ([r["mean_source_words"] for r in rows], [r["sentences_per_second"] for r in rows])},
                           ctx.plot(figure), title, "mean source length (words)", "sentences / second (batch 1)")
    return rows


def rela_speed(ctx: Context) -> dict:
    rows = _speed_by_length(ctx, "rela-speed", f"ReLA Figure 2: decoding speed by source length ({ctx.name})")
    return {"batch_size": 1, "num_beams": ctx.options.num_beams, "groups": rows}


# ---- GMM ---------------------------------------------------------------------------------------------------------------
def gmm_entropy(ctx: Context) -> dict:
    out = entropy_by_length(ctx.model, ctx.batches(desc="entropy"), TABLE6_EDGES)
    if ctx.plot("gmm-entropy"):
        labels = ["all", *common.bucket_labels(TABLE6_EDGES)]
        series = {name: (list(range(len(labels))), [v[k] for k in labels]) for name, v in out.items()}
        common.plot_series(series, ctx.plot("gmm-entropy"), f"GMM Table 6: attention entropy by source length "
                           f"({ctx.name})", "source length (tokens)", "entropy (nats)", xticks=labels)
    return out


def gmm_alignment(ctx: Context) -> dict:
    res = _aer(ctx, False)
    row = res["layers"][-2 if len(res["layers"]) > 1 else -1]
    return {"layer": row["layer"], "aer": row["aer"], "precision": row["precision"], "recall": row["recall"],
            "sentences": res["sentences"], "skipped": res["skipped"]}


def _bleu_plot(ctx: Context, figure: str, rows_by: dict, title: str, edges) -> None:
    if ctx.plot(figure):
        labels = common.bucket_labels(edges)
        series = {k: (list(range(len(labels))), [r["bleu"] for r in rows]) for k, rows in rows_by.items()}
        common.plot_series(series, ctx.plot(figure), title, "sentence length (words)", "BLEU", xticks=labels)


def gmm_bleu(ctx: Context) -> dict:
    rows = common.bleu_by_bucket(ctx.hypotheses(), ctx.targets, [common.words(s) for s in ctx.sources], GMM_BLEU_EDGES)
    _bleu_plot(ctx, "gmm-bleu", {ctx.name: rows}, f"GMM Figure 7: BLEU by source length ({ctx.name})", GMM_BLEU_EDGES)
    return {"by_source_length": rows}


# ---- ReLUFormer --------------------------------------------------------------------------------------------------------
def reluformer_layers(ctx: Context) -> dict:
    out = layer_entropy_and_mass(ctx.model, ctx.batches(desc="entropy"), ctx.options.top_p_values)
    if ctx.plot("reluformer-layers"):
        series = {f"{site} H(s)": ([r["layer"] + 1 for r in rows], [r["entropy"] for r in rows]) for site, rows in out.items()}
        p = str(ctx.options.top_p_values[-1])
        series.update({f"{site} top-{float(p):.1%}": ([r["layer"] + 1 for r in rows], [r["top_p_mass"][p] for r in rows])
                       for site, rows in out.items()})
        common.plot_series(series, ctx.plot("reluformer-layers"), f"ReLUFormer Table 3 / Figures 2, 4: entropy and "
                           f"top-p% mass by layer ({ctx.name})", "layer", "entropy (nats) / mass")
    return out


def reluformer_long(ctx: Context) -> dict:
    most = getattr(ctx.model.config, "max_position_embeddings", None)
    longest = max(ctx.options.long_lengths)
    if most and longest + 2 > most:
        raise HfAttnInputError(f"--long_lengths {longest}: {ctx.name} has {most} positions, so the longest input is "
                               f"{most - 2} tokens; give lengths <= {most - 2}")
    out = {}
    for limit in ctx.options.long_lengths:
        src, tgt = long_documents(ctx.tokenizer, ctx.sources, ctx.targets, limit)
        layers = layer_entropy_and_mass(ctx.model, ctx.batches(src, tgt, max_length=limit + 2, desc=f"length {limit}"),
                                        ctx.options.top_p_values)
        out[str(limit)] = {"documents": len(src), "layers": layers, "sites": {
            site: {"entropy": sum(r["entropy"] for r in rows) / len(rows),
                   "top_p_mass": {p: sum(r["top_p_mass"][p] for r in rows) / len(rows) for p in rows[0]["top_p_mass"]}}
            for site, rows in layers.items()}}
    if ctx.plot("reluformer-long"):
        xs = list(ctx.options.long_lengths)
        series = {site: (xs, [out[str(n)]["sites"][site]["entropy"] for n in xs]) for site in out[str(xs[0])]["sites"]}
        common.plot_series(series, ctx.plot("reluformer-long"), f"ReLUFormer Tables 3, 5 / Figures 2, 4: entropy by "
                           f"input length ({ctx.name})", "input length limit L (tokens)", "entropy H(s) (nats)")
    return out


# ---- Calibration -------------------------------------------------------------------------------------------------------
def _calibration(ctx: Context) -> dict:
    if not calibration_modules(ctx.model):
        raise Skip("the model has no calibrated cross-attention (presets calibration-*)")
    return ctx.once("calibration", lambda: calibration_statistics(ctx.model, ctx.batches(desc="calibration")))


def calibration_jsd(ctx: Context) -> dict:
    stats = _calibration(ctx)
    rows = [{"layer": r["layer"], "jsd": r["jsd"]} for r in stats["layers"]]
    if ctx.plot("calibration-jsd"):
        common.plot_series({ctx.name: ([r["layer"] + 1 for r in rows], [r["jsd"] for r in rows])},
                           ctx.plot("calibration-jsd"), f"Calibration Figure 6: JSD before/after calibration per layer "
                           f"({ctx.name})", "decoder layer", "JSD (nats)")
    return {"layers": rows, "jsd": stats["jsd"]}


def calibration_jsd_entropy(ctx: Context) -> dict:
    rows = _calibration(ctx)["jsd_by_entropy"]
    if ctx.plot("calibration-jsd-entropy"):
        labels = [r["bucket"] for r in rows]
        common.plot_series({ctx.name: (list(range(len(rows))), [r["jsd"] for r in rows])}, ctx.plot("calibration-jsd-entropy"),
                           f"Calibration Figure 7: JSD by entropy of the original attention ({ctx.name})",
                           "entropy of the original attention (nats)", "JSD (nats)", xticks=labels)
    return {"buckets": rows}


def calibration_entropy(ctx: Context) -> dict:
    stats = _calibration(ctx)
    keys = ("layer", "entropy_original", "entropy_calibrated", "entropy_change")
    return {"layers": [{k: r[k] for k in keys} for r in stats["layers"]], "all": stats["entropy_change"]}


def calibration_kendall(ctx: Context) -> dict:
    n = min(len(ctx.sources), ctx.options.kendall_sentences)
    out = kendall_with_gradients(ctx.model, ctx.batches(ctx.sources[:n], ctx.targets[:n], desc="gradients"))
    if ctx.plot("calibration-kendall"):
        series = {kind: ([r["layer"] + 1 for r in rows], [r["kendall_tau"] for r in rows]) for kind, rows in out.items() if rows}
        common.plot_series(series, ctx.plot("calibration-kendall"), f"Calibration Figures 2, 5: Kendall tau with "
                           f"gradient importance ({ctx.name})", "decoder layer", "Kendall tau")
    return {"sentences": n, **out}


# ---- RAN ---------------------------------------------------------------------------------------------------------------
def ran_histograms(ctx: Context) -> dict:
    out = weight_histograms(ctx.model, ctx.batches(desc="histograms"), ctx.options.bins)
    if ctx.plot("ran-histograms"):
        plot_histograms(out, ctx.plot("ran-histograms"), f"RAN Figure 5: attention weight histograms ({ctx.name})")
    return {"bins": ctx.options.bins, "histograms": out}


def ran_layer_jsd(ctx: Context) -> dict:
    out = layer_pair_jsd(ctx.model, ctx.batches(desc="layer JSD"))
    if ctx.plot("ran-layer-jsd"):
        plot_matrices(out, ctx.plot("ran-layer-jsd"), f"RAN Figure 7: JSD between layers ({ctx.name})")
    return out


def ran_bleu(ctx: Context) -> dict:
    hyps = ctx.hypotheses()
    out = {f"by_{side}_length": common.bleu_by_bucket(hyps, ctx.targets, [common.words(s) for s in texts], RAN_BLEU_EDGES)
           for side, texts in (("source", ctx.sources), ("target", ctx.targets))}
    _bleu_plot(ctx, "ran-bleu", out, f"RAN Figure 8: BLEU by sentence length ({ctx.name})", RAN_BLEU_EDGES)
    return out


def ran_speed(ctx: Context) -> dict:
    a = ctx.options
    by_batch = [{"batch_size": b, **common.speed_by_groups(ctx.model, ctx.tokenizer, {f"batch {b}": ctx.sources}, b,
                                                           a.num_beams, a.speed_repeats)[0]} for b in a.speed_batch_sizes]
    by_beam = [{"num_beams": k, **common.speed_by_groups(ctx.model, ctx.tokenizer, {f"beam {k}": ctx.sources},
                                                          a.batch_size, k, a.speed_repeats)[0]} for k in a.speed_beams]
    by_length = _speed_by_length(ctx, "ran-speed", f"RAN Figure 3: decoding speed against length ({ctx.name})")
    return {"by_batch_size": by_batch, "by_beam_size": by_beam, "by_length": by_length}


FIGURES = {
    "rela-null-shuffled": (rela_null_shuffled, "ReLA Figure 6 (dashed): null rate per layer, targets shuffled"),
    "rela-rank-null": (rela_rank_null, "pairs ranked by cross-attention null rate (--rank-null, --shuffle-fraction)"),
    "rela-alignment": (rela_alignment, "ReLA Section 5.3: word alignment from merged subword attention (Pharaoh)"),
    "rela-aer": (rela_aer, ("ReLA Figure 4, Table 5: AER per layer, best head and layer attention, normal and "
                            "shifted (--gold-alignments)")),
    "rela-speed": (rela_speed, "ReLA Figure 2: decoding speed by source-length group, batch size 1"),
    "gmm-entropy": (gmm_entropy, "GMM Table 6: entropy of mixture, dot-product and fused attention by source length"),
    "gmm-alignment": (gmm_alignment, "GMM Table 7: AER, precision, recall, penultimate layer (--gold-alignments)"),
    "gmm-bleu": (gmm_bleu, "GMM Figure 7: BLEU by source-length bucket"),
    "reluformer-layers": (reluformer_layers, "ReLUFormer Table 3, Figures 2 and 4: entropy and top-p% mass by layer"),
    "reluformer-long": (reluformer_long, ("ReLUFormer Tables 3 and 5, Figures 2 and 4: the same by input length "
                                          "(--long_lengths)")),
    "calibration-jsd": (calibration_jsd, "Calibration Figure 6: JSD original vs calibrated attention per layer"),
    "calibration-jsd-entropy": (calibration_jsd_entropy, "Calibration Figure 7: that JSD by attention-entropy bucket"),
    "calibration-entropy": (calibration_entropy, "Calibration Table 5: entropy change per layer"),
    "calibration-kendall": (calibration_kendall, ("Calibration Figures 2 and 5: Kendall tau of attention / mask vs "
                                                  "gradient importance")),
    "ran-histograms": (ran_histograms, "RAN Figure 5: histograms of the attention weights"),
    "ran-layer-jsd": (ran_layer_jsd, "RAN Figure 7: JSD between the attention of layer pairs"),
    "ran-bleu": (ran_bleu, "RAN Figure 8: BLEU by source and target length"),
    "ran-speed": (ran_speed, "RAN Figure 3: decoding speed by batch size, beam size and length"),
}


def help_text() -> str:
    width = max(map(len, FIGURES))
    return "figures (--figures NAME,... or all):\n" + "\n".join(f"  {n:<{width}}  {d}" for n, (_, d) in FIGURES.items())


def parse_figures(value: str | Sequence[str] | None) -> list[str]:
    """The figure names of ``value``: comma-separated names (or a list of them), or ``all`` (every figure, also
    when it comes with names)."""
    if not value:
        return []
    if isinstance(value, str):
        value = value.split(",")
    names = [n.strip() for n in value if n.strip()]
    for n in names:
        if n not in FIGURES and n != "all":
            raise HfAttnInputError(f"--figures {n!r} is not a figure{did_you_mean(n, FIGURES)}; "
                                   f"valid: all, {', '.join(FIGURES)}")
    return list(FIGURES) if "all" in names else names


def run_figures(ctx: Context, names) -> dict:
    """``{figure: numbers or {"skipped": reason}}`` for one model."""
    out = {}
    for n in names:
        try:
            out[n] = FIGURES[n][0](ctx)
        except Skip as why:
            out[n] = {"skipped": str(why)}
            print(f"{ctx.name}: {n} skipped: {why}")
    return out


def _comma_list(values) -> str:
    return (",".join(map(str, values)) or "()") if isinstance(values, (list, tuple)) else repr(values)


def check_arguments(options: AnalyzeOptions) -> list[str]:
    """Validate the figure options (one clear error each, naming the flag); the figure names to run."""
    o = options
    names = parse_figures(o.figures)
    if (o.rank_null or o.shuffle_fraction is not None) and "rela-rank-null" not in names:
        names.append("rela-rank-null")
    if o.shuffle_fraction is not None and not 0 < o.shuffle_fraction < 1:
        raise HfAttnInputError(f"--shuffle-fraction {o.shuffle_fraction}: need a share in (0, 1), e.g. 0.05")
    if not 0 < o.top_share <= 1:
        raise HfAttnInputError(f"--top_share {o.top_share}: need a share in (0, 1], e.g. 0.1")
    for flag in ("num_beams", "speed_groups", "speed_repeats", "kendall_sentences", "bins"):
        if getattr(o, flag) < 1:
            raise HfAttnInputError(f"--{flag} {getattr(o, flag)}: need at least 1")
    for flag in NUMBER_LISTS:
        values, kind = getattr(o, flag), float if flag == "top_p_values" else int
        numbers = isinstance(values, (list, tuple)) and values and all(
            isinstance(v, (kind, int)) and not isinstance(v, bool) for v in values)
        if not numbers or min(values) <= 0:
            raise HfAttnInputError(f"--{flag} {_comma_list(values)}: need a list of {kind.__name__} values > 0, "
                                   f"e.g. {_comma_list(option_defaults()[flag])}")
    if any(p > 1 for p in o.top_p_values):
        raise HfAttnInputError(f"--top_p_values {_comma_list(o.top_p_values)}: need shares in (0, 1], e.g. 0.01,0.1")
    for flag in ("rank_null", "gold_alignments"):
        path = getattr(o, flag)
        if path and not Path(path).is_file():
            raise HfAttnInputError(f"--{flag.replace('_', '-')} {path!r}: no such file")
    return names
