"""What each paper claims, beside what the recorded runs show: one claim per row, judged by a stated criterion on
every group of runs (base, pair, budget, extra flags; one run per seed) that has the runs the claim needs.

A claim on ΔBLEU between two presets (`SeedDelta`) is judged on the seed-aware 95% interval of `seeds.seed_bootstrap`
and only where both presets have at least `seeds.MIN_SEEDS` seeds in the group; with fewer its row says "not enough
seeds" and the verdict leaves it out. Any other claim is judged on the mean (`mean_record`) over the seeds that all
its presets have in the group; a claim about divergence counts a run that failed in any of them as failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..bench.results import BenchmarkResult
from ..modeling.hyperparameters import SITES
from .claim_checks import (SeedDelta, _about_equal, _better, _entropy_falls, _fails, _faster_decoding, _gmm_gate,
                           _lower_bleu, _lower_entropy, _mask_concentrates, _not_worse, _pooled, _rela_sparse,
                           delta_ci)
from .evidence import budget_trend, gap_by_group, loss_gap, per_seed, site_by_budget
from .seeds import MIN_SEEDS, complete, group_name, group_records, group_title, p_text, seed_delta


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str
    criterion: str
    presets: tuple  # the runs it needs in one group
    check: Callable  # a `SeedDelta`; or (runs: {preset: `mean_record`}) -> (holds: bool, what we see: str);
    # a benchmark claim's: (rows: {preset: `SentenceRow`}, `BenchSettings`) -> the same
    explanation: str  # our best explanation where it does not hold
    judges_failed_runs: bool = False  # the claim is about divergence: a failed run is evidence, not a gap
    trend: str | None = None  # a preset whose validation-loss gap and ΔBLEU against softmax the explanation traces
    benchmark: bool = False  # judged on `scripts/benchmark.py` results (`BenchmarkResult`), not on the runs
    experiments: tuple = ()  # ids of the "Recipe sensitivity" experiments that test the explanation
    evidence: tuple = ()  # of (records) -> sentences computed from the runs that back the explanation

    @property
    def rule(self) -> str:
        """The criterion with how seeds enter it."""
        if self.benchmark:
            return self.criterion
        if isinstance(self.check, SeedDelta):
            return f"{self.criterion} ({MIN_SEEDS}+ seeds of each)"
        return f"{self.criterion} (mean over the seeds these presets share)"


_GATE_01 = ("--gmm_gate_init", "0.1")  # the `gmm-gate` arm that became the default: GMM's adopted runs at 600 steps


CLAIMS = (
    Claim("ReLA", "ReLA-g's attention is sparse, with null rows (heads switched off for a query)",
          "sparsity > 0.5 at every site and a null rate > 0 at some site", ("rela-g",), _rela_sparse,
          "ReLU scores need training to separate: early in training most q.k are still positive. The paper's figures "
          "come from fully trained WMT models."),
    Claim("ReLA", "ReLU alone, without normalisation, fails to train (Table 1, row 4)",
          "`relu` diverges or scores under half of softmax's BLEU", ("relu", "softmax"), _fails("relu", "softmax"),
          "Measured (`clipping`): gradient clipping is what lets `relu` train here. Without it, as the authors "
          "train, `relu` does not train at our learning-rate peak (BLEU near 0, and the source probe near 0: the "
          "model does not read the source), the paper's failure; with our clip at norm 1.0 it trains, by switching "
          "attention off rather than training it: most of its encoder self-attention rows are null, and the encoder "
          "translates through its residual and feed-forward paths (the per-seed figures below).", True,
          experiments=("clipping",),
          evidence=(per_seed("relu", "softmax", train_args=("--max_grad_norm", "0")), per_seed("relu", "softmax"))),
    Claim("ReLA", "ReLA-g translates about as well as softmax (Tables 1-3: within about 0.5 BLEU)",
          "ΔBLEU within ±1, or its seed-aware 95% interval contains 0", ("rela-g", "softmax"), _about_equal("rela-g"),
          "Measured, not the recipe: under a lower learning-rate peak and under xavier init without clipping rela-g "
          "stays behind softmax (`recipe`). The gap sits in the cross-attention: ReLA-g in the encoder or the decoder "
          "self-attention alone is level with softmax, in the cross-attention alone it is far behind and unstable "
          "across seeds, and in its worst seed the model barely reads the source (`rela-sites`, the probe column). "
          "The paper finds the opposite site pattern on fully trained models (300k steps); at our budgets ReLA's "
          "cross-attention learns to read the source late. Where the validation losses part shows in the sentences "
          "below (computed from the runs).", trend="rela-g", experiments=("recipe", "rela-sites")),
    Claim("GMM", "The gate leans on the Gaussian mixture in the lower decoder layers (Figure 5)",
          "mean gate of the first decoder layer > that of the last", ("gmm",), _gmm_gate,
          "A short run leaves the gate near its initial value; the paper's layer pattern emerges with training.",
          experiments=("gmm-gate",)),
    Claim("GMM", "Concentrated cross-attention: lower cross-attention entropy than softmax (Table 6)",
          "cross-attention entropy of `gmm` < softmax's", ("gmm", "softmax"), _lower_entropy("gmm", ("cross",)),
          "The mixture is a Gaussian over source positions: unless its widths shrink, it is broader than a trained "
          "dot-product peak, and the larger the gate's share (the gate row of the same setup), the more entropy it "
          "adds. Bible verses are short (about 30 tokens), where the paper reports its smallest effect (Figure 7: a "
          "slight drop on short sentences, where K = 4 centres are hard to place).", experiments=("gmm-gate",)),
    Claim("GMM", "Gaussian-mixture cross-attention translates better than the dot-product baseline (Table 2: "
          "significant gains)", "the seed-aware 95% interval of ΔBLEU lies above 0", ("gmm", "softmax"),
          _better("gmm"),
          "A gate started at 0.5 puts half of every query's cross-attention on the middle of the source before the "
          "mixture has learned anything, and slows GMM; started at 0.1 (now the default) GMM trains clearly better "
          "but stays a little behind softmax at 600 steps (`gmm-gate`), most of that gap in the brevity penalty: "
          "its translations come out shorter (below). At 1,800 steps the length gap has closed and GMM is within the "
          "seed-aware interval of softmax at de->en, a little behind in precision; ru->en, further from converged at "
          "600 steps, shows both gaps wider (below). Strict normalisation, whose gate "
          "learns to stay low, is level with softmax at 600 and 1,800 steps (`gmm-strict-long`): on short Bible "
          "verses the mixture adds little over dot-product attention. The paper's gains are largest on long "
          "sentences (Figure 7); at these budgets GMM is not ahead on the longest verses either (BLEU by source "
          "length in the Across-seeds sections).", trend="gmm",
          experiments=("gmm-gate", "gmm-strict-long"), evidence=(gap_by_group("gmm", arms=((), _GATE_01)),)),
    Claim("ReLUFormer", "Without the variance-reduction scale factor, training diverges (Table 5)",
          "`reluformer-no-scale` diverges or scores under half of `reluformer`'s BLEU",
          ("reluformer-no-scale", "reluformer"), _fails("reluformer-no-scale", "reluformer"),
          "Measured (`clipping`): the divergence appears once gradient clipping is off (the paper names none). "
          "Without it `reluformer-no-scale` does not train in most seeds (BLEU near 0, the source probe near 0: the "
          "model does not read the source), while `reluformer` with its scale factor "
          "trains in every seed, though well behind itself with clipping (the per-seed figures below). Our clip at "
          "norm 1.0 bounds the updates that the unscaled scores blow up; with it, the factor does not matter on "
          "Bible verses (about 30 tokens), where the variance it corrects, which grows with the length n, is small.",
          True, experiments=("clipping",),
          evidence=(per_seed("reluformer-no-scale", "reluformer", train_args=("--max_grad_norm", "0")),)),
    Claim("ReLUFormer", "Without the regulariser L_reg, BLEU drops (Table 5: -1.37 BLEU)",
          "the seed-aware 95% interval of ΔBLEU (`reluformer-no-reg` - `reluformer`) lies below 0",
          ("reluformer-no-reg", "reluformer"), _lower_bleu("reluformer-no-reg", "reluformer"),
          "Without L_reg's norm term nothing keeps a row's sum away from 0, and rows die. Where almost every "
          "cross-attention row dies, the source probe is near 0: the decoder no longer reads the source, and BLEU "
          "falls far further than the paper's -1.37 (the per-seed figures below).",
          evidence=(per_seed("reluformer-no-reg", "reluformer"),)),
    Claim("ReLUFormer", "Without the regulariser L_reg, the attention entropy falls (Table 5: -1.52)",
          "entropy of `reluformer-no-reg` < `reluformer`'s at every site", ("reluformer-no-reg", "reluformer"),
          _entropy_falls("reluformer-no-reg", "reluformer"),
          "Measured per seed (below): without L_reg's norm term nothing keeps a row's sum away from 0, and rows die. "
          "Where the cross-attention keeps its rows, the entropy falls at every site, as the paper reports. Where "
          "almost every cross-attention row dies, the source probe is near 0 (the decoder no longer reads the "
          "source) and the few live cross-attention rows, renormalised, are flat: they lift the mean over seeds "
          "above `reluformer`'s at that site. Which of the two happens is up to the seed at this budget.",
          evidence=(per_seed("reluformer-no-reg", "reluformer"),)),
    Claim("ReLUFormer", "ReLU attention has lower entropy than softmax (Table 3)",
          "entropy of `reluformer` < softmax's at every site", ("reluformer", "softmax"),
          _lower_entropy("reluformer", SITES),
          "Measured over budgets (below): at de->en, 600 steps, ReLUFormer's encoder and decoder self-attention are "
          "already sharper than softmax's while its cross-attention is still flatter; with 3x the steps the "
          "cross-attention sharpens past softmax's and the claim holds at every site. At ru->en, 600 steps, the two "
          "cross-attentions are about level (the row above). Entropy is measured on rows renormalised to "
          "sum 1.", evidence=(site_by_budget("reluformer"),)),
    Claim("ReLUFormer", "ReLUFormer translates at least as well as softmax (Table 4: 34.56 vs 34.22 BLEU on IWSLT14 "
          "De-En)", "the seed-aware 95% interval of ΔBLEU reaches 0 or above", ("reluformer", "softmax"),
          _not_worse("reluformer"),
          "Measured: at L_reg weight 1 the attention collapses onto single keys (encoder entropy near 0, far under "
          "the paper's 1.60 nats with L_reg) and BLEU falls far below softmax; at weight 0.05 (now the default) the "
          "entropy recovers and most of the gap closes, while gamma 0.36 leaves the collapse in place "
          "(`reluformer`). L_reg's entropy margin max(H - C, 0) only bounds the entropy from above, and a row with "
          "all its weight on one key and sum 1 satisfies both terms, so a strong L_reg pushes rows to collapse; the "
          "paper gives no weight.", trend="reluformer", experiments=("reluformer",)),
    Claim("Calibration", "The mask-perturbation model masks few, informative source tokens (Figures 1, 2)",
          "fewer than half of the source tokens removed (m < 0.5) in every layer and the top 10% of tokens hold >= 20% "
          "of the importance 1 - m", ("calibration-gate",), _mask_concentrates,
          "The perturbation model is trained adversarially with a sparsity penalty; in a short run the masks are still "
          "close to their initial, uniform value.", experiments=("calibration-alpha",)),
    Claim("Calibration", "Calibrated attention translates better than the baseline (Tables 2-4: +0.4 to +1.4 "
          "BLEU)", "the seed-aware 95% interval of ΔBLEU lies above 0", ("calibration-gate", "softmax"),
          _better("calibration-gate"),
          "Measured over three seeds: calibration is ahead of softmax at 600 steps, by about the paper's gain, and "
          "level with it at 1,800 steps, under today's mask penalty and under the per-entry equivalent of the "
          "paper's, which changes neither the masks nor BLEU (`calibration-alpha`): with 3x the steps softmax "
          "closes the gap (the per-seed figures below). The paper reports its gain after full training, which these "
          "budgets do not reach.",
          trend="calibration-gate", experiments=("calibration-alpha",)),
    Claim("RAN", "RAN-D translates at least as well as softmax (Table 1: +0.5 BLEU on average)",
          "the seed-aware 95% interval of ΔBLEU reaches 0 or above", ("ran-d", "softmax"), _not_worse("ran-d"),
          "RAN-D's decoder self-attention comes from its recurrence over positions, not from query-key scores, and is "
          "learned from the translation loss alone; its gap to softmax group by group, split into length and "
          "precision, and by budget, is below.", trend="ran-d", evidence=(gap_by_group("ran-d"),)),
    Claim("RAN", "RAN-ALL decodes faster than the Transformer (Section 4.3, Figure 3: about 1.2x across beam sizes)",
          "`ran-all` beam search more than 1.05x as fast as stock transformers with SDPA (`scripts/benchmark.py`; "
          "±0.05 is its noise)", ("ran-all",), _faster_decoding("ran-all", also=("ran-d",)),
          "RAN saves only the self-attention's query-key product and softmax; cross-attention, the linear layers and "
          "the beam bookkeeping stay. In this small model the stock model spends the share given beside the ratios "
          "in its attention op, so even self-attention that cost nothing would decode at most 1 / (1 - share) as "
          "fast; the paper measures a 6+6-layer, 512-dim Transformer with batches of up to 100 sentences.",
          benchmark=True),
)


def _judge_delta(d: SeedDelta, runs: dict, seed_cmp) -> dict | None:
    """A comparative claim on one group: holds or not on the seed-aware interval, or not enough seeds."""
    a, b = complete(runs[d.a]), complete(runs[d.b])
    if not a or not b:
        return None
    result, reason = seed_delta(a, b, seed_cmp)
    if result is None:
        return {"holds": None, "verdict": reason, "observed": f"{len(a)} seed(s) of `{d.a}`, {len(b)} of `{d.b}`"}
    s = result["bleu"]
    holds = bool(d.holds(s["delta"], s["ci"]))
    return {"holds": holds, "verdict": "holds" if holds else "does not hold",
            "observed": f"ΔBLEU {delta_ci(s)}, p {p_text(s['p_value'])}; seeds {len(a)} / {len(b)}"}


def _judge_pooled(c: Claim, runs: dict) -> dict | None:
    """Any other claim on one group, on the mean over the seeds all its presets have there (at least `MIN_SEEDS`;
    fewer: "not enough seeds")."""
    shared = set.intersection(*({r["spec"]["seed"] for r in runs[p]} for p in c.presets))
    if len(shared) < MIN_SEEDS:
        return {"holds": None, "verdict": f"not enough seeds (n={len(shared)})",
                "observed": f"seeds shared by {', '.join(f'`{p}`' for p in c.presets)}: "
                            f"{', '.join(map(str, sorted(shared))) or 'none'}"}
    pooled = {p: _pooled([r for r in runs[p] if r["spec"]["seed"] in shared], c.judges_failed_runs) for p in c.presets}
    if not c.judges_failed_runs and any(r["status"] != "complete" for r in pooled.values()):
        return None
    try:
        holds, what = c.check(pooled)
    except (KeyError, TypeError, ValueError):  # a run this claim reads has no such figure (failed run)
        return None
    seeds = f" (mean over seeds {', '.join(map(str, sorted(shared)))})" if len(shared) > 1 else ""
    return {"holds": bool(holds), "verdict": "holds" if holds else "does not hold", "observed": what + seeds}


def judge(c: Claim, groups: dict, benchmarks: dict[str, BenchmarkResult], seed_cmp=None) -> list[dict]:
    """Where ``c`` can be judged, whether it holds (None: not enough seeds) and what we see: per group of runs
    (`seeds.group_records`), or per benchmark result. ``seed_cmp(a_records, b_records)``: `seeds.seed_bootstrap`
    of two presets' runs, for the comparative claims."""
    seen = []
    if c.benchmark:
        for label, result in sorted(benchmarks.items()):
            rows = {r.preset: r for r in result.rows}
            if all(p in rows and "decode" in rows[p].calls for p in c.presets):
                holds, what = c.check(rows, result.settings)
                seen.append({"setup": label, "holds": bool(holds), "verdict": "holds" if holds else "does not hold",
                             "observed": what})
        return seen
    for key, runs in sorted(groups.items()):
        if key[-1] or not all(p in runs for p in c.presets):  # flagged groups are the experiments' arms
            continue
        row = _judge_delta(c.check, runs, seed_cmp) if isinstance(c.check, SeedDelta) else _judge_pooled(c, runs)
        if row:
            seen.append({"setup": group_name(key), "title": group_title(key), **row})
    return seen


def verdict(seen: list[dict]) -> str:
    """A claim's verdict from its rows; rows without enough seeds are left out."""
    judged = [s["holds"] for s in seen if s["holds"] is not None]
    if not seen:
        return "not measured yet"
    if not judged:
        return "not enough seeds"
    return "agrees" if all(judged) else "disagrees" if not any(judged) else "mixed"


def _explanation(c: Claim, records: list[dict], sig: dict, experiment_ids) -> str:
    trend = f"{loss_gap(records, c.trend)} {budget_trend(records, sig, c.trend)}" if c.trend else ""
    trend = " ".join([*(e(records) for e in c.evidence), trend])
    links = [f"[Recipe sensitivity: `{e}`](#experiment-{e})" for e in c.experiments if e in experiment_ids]
    return " ".join(f"{c.explanation} {trend}".split()) + (f" See {', '.join(links)}." if links else "")


def claims_section(records: list[dict], sig: dict, benchmarks: dict[str, BenchmarkResult] | None = None,
                   seed_cmp=None, experiment_ids=()) -> tuple[list[str], list[dict]]:
    """The claims table and its explanations. ``sig``: the per-seed paired bootstraps (for the budget trends);
    ``benchmarks``: {label: a `scripts/benchmark.py` result (`bench.results.load_result`)} for the speed claims;
    ``seed_cmp``: see `judge`;
    ``experiment_ids``: the "Recipe sensitivity" experiments in the report, linked from the explanations."""
    groups = group_records(records)
    rows, md = [], ["## What the papers claim, and what we see", "",
                    "Judged per group of runs of the adopted recipe (pair, budget, base, no extra flags: the "
                    "experiments' arms are judged in \"Recipe sensitivity\"; one run per seed), only where every "
                    f"preset a claim reads has at least {MIN_SEEDS} seeds there; with fewer its row says \"not enough "
                    "seeds\" and the verdict leaves it out. A claim on ΔBLEU between two presets rests on the "
                    "seed-aware 95% interval alone (test sentences and training seeds resampled together). Other "
                    "claims are judged on the mean over the seeds that all the presets they read have in the group; "
                    "for the claims about divergence a run that failed in any of those seeds counts as failed.", "",
                    "| paper | claim | criterion | group | what we see | verdict |", "|---|---|---|---|---|---|"]
    for c in CLAIMS:
        seen = judge(c, groups, benchmarks or {}, seed_cmp)
        v = verdict(seen)
        explanation = _explanation(c, records, sig, experiment_ids) if v in ("disagrees", "mixed") else None
        rows.append({"paper": c.paper, "claim": c.claim, "criterion": c.rule, "verdict": v, "seen": seen,
                     "explanation": explanation})
        if not seen:
            md.append(f"| {c.paper} | {c.claim} | {c.rule} | - | - | not measured yet |")
        for i, s in enumerate(seen):
            md.append(f"| {c.paper if i == 0 else ''} | {c.claim if i == 0 else ''} | {c.rule if i == 0 else ''} | "
                      f"{s.get('title', s['setup'])} | {s['observed']} | {s['verdict']} |")
    md += [""]
    explained = [r for r in rows if r["explanation"]]
    if explained:
        md += ["Where a claim does not hold, our best explanation:", ""]
        md += [f"- **{r['paper']}: {r['claim']}** ({r['verdict']}). {r['explanation']}" for r in explained] + [""]
    return md, rows
