"""The rule types of the pre-registered files (``experiments.json``, ``retrofit.json``): a rule compares two cells,
a - b in BLEU, and is met when the seed-aware 95% interval of that difference lies where its type says, relative to
its ``margin``. The files are checked against `RULES` before their runs (`retrofit.check_retrofit`, the report's
`experiments.check_experiments`) and the report judges each rule with it (`experiments.judge_rule`)."""

from __future__ import annotations

# type -> (met?(interval low, interval high, margin), how the report words the criterion)
RULES = {"above": (lambda lo, hi, m: lo > m, "interval above {m:g}"),
         "below": (lambda lo, hi, m: hi < m, "interval below {m:g}"),
         "not_below": (lambda lo, hi, m: hi >= m, "interval reaches {m:g} or above")}
