"""The figures of one run record that the report's tables show, and how a cell prints them."""

from __future__ import annotations

import math
import statistics

from ..analysis.stats import LAYER_KEYS
from ..modeling.hyperparameters import SITES
from .seeds import complete


SHOW = {"bp": ("BP", ".3f"), "gmm_gate": ("GMM gate, mean over layers", ".2f"),
        "calibration_mask_mean": ("calibration mask m, mean over layers", ".2f"),
        "source_use": ("source probe: loss shuffled - true", ".2f")}
SITE_STATS = (*LAYER_KEYS, "top_p_mass")  # the statistics of a site in a run record


def fmt(x, spec=".1f", none="-"):
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def mean_of(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def seed_list(runs: list[dict]) -> str:
    failed = len(runs) - len(complete(runs))
    return ", ".join(str(r["spec"]["seed"]) for r in complete(runs)) + (f"; {failed} failed" if failed else "")


def failure_text(runs: list[dict]) -> str:
    r = next((r for r in runs if r["status"] != "complete"), runs[0])
    return f"failed: {r.get('error', r['status'])}" if r["status"] != "complete" else "no test translations"


def show_value(record: dict, column: str) -> float | None:
    """One run's figure for a column: ``bp``, ``gmm_gate`` (mean over layers), ``calibration_mask_mean`` (mean m
    over layers), ``source_use`` (the source probe's loss with shuffled sources minus with the true ones) or
    ``STAT.SITE`` (e.g. ``entropy.cross``, from the attention statistics); None where it has none."""
    a = record.get("analysis") or {}
    if column == "bp":
        return ((record.get("results") or {}).get("bleu_details") or {}).get("bp")
    if column == "gmm_gate":
        return mean_of(a.get("gmm_gate", {}).values())
    if column == "calibration_mask_mean":
        return mean_of(v["mean_mask"] for v in a.get("calibration_mask", {}).values())
    if column == "source_use":  # how much worse the loss gets with every source moved to the next pair: ~0 = unread
        probe = a.get("probe") or {}
        return probe["loss_shuffled"] - probe["loss_true"] if "loss_true" in probe else None
    stat, site = column.split(".")
    return ((a.get("attention") or {}).get("sites") or {}).get(site, {}).get(stat)


def known_column(column) -> bool:
    return column in SHOW or (isinstance(column, str) and column.count(".") == 1 and
                              column.split(".")[0] in SITE_STATS and column.split(".")[1] in SITES)


def column_head(column: str) -> tuple[str, str]:
    if column in SHOW:
        return SHOW[column]
    stat, site = column.split(".")
    return f"{site} {stat.replace('_', ' ')}", ".3f" if stat != "entropy" else ".2f"
