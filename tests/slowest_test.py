"""The README's figure for the test suite, kept honest without timing the suite: no single test (set-up, call and
tear-down together) may take longer than `BOUND_S`. A run in which one does fails, naming the test, its time and
the bound. conftest.py registers the two hooks; `HF_ATTN_SLOWEST_TEST_S` moves the bound (e.g. on a slower
machine)."""

from __future__ import annotations

import os
from collections import defaultdict

# stated in the README ("no test takes more than 7 minutes"); the slowest test took 65 s on 2 quiet cores
# (249 s on cores shared with two other test runs), so a busy machine does not trip it, and a test that grows
# several-fold does
BOUND_S = 420.0


def bound_s() -> float:
    value = os.environ.get("HF_ATTN_SLOWEST_TEST_S", "")
    try:
        return float(value) if value else BOUND_S
    except ValueError:
        raise SystemExit(f"HF_ATTN_SLOWEST_TEST_S={value!r} is not a number of seconds (e.g. 120)") from None


class SlowestTest:
    """Each test's seconds (its set-up, call and tear-down reports summed), and which went over the bound."""

    def __init__(self, bound: float):
        self.bound = bound
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, report) -> None:
        self.seconds[report.nodeid] += report.duration

    def over(self) -> list[tuple[float, str]]:
        return sorted(((s, nodeid) for nodeid, s in self.seconds.items() if s > self.bound), reverse=True)

    def verdict(self) -> str | None:
        """One line per test over the bound, or None when every test kept under it."""
        over = self.over()
        if not over:
            return None
        lines = [f"{nodeid} took {s:.1f} s, over the {self.bound:g} s any one test may take (the README's suite "
                 "time depends on it): make it cheaper, or set HF_ATTN_SLOWEST_TEST_S on a slower machine"
                 for s, nodeid in over]
        return "\n".join(lines)


SLOWEST = SlowestTest(bound_s())


def pytest_runtest_logreport(report):
    SLOWEST.add(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    verdict = SLOWEST.verdict()
    if verdict:
        terminalreporter.write_sep("=", "tests over the time bound", red=True)
        terminalreporter.write_line(verdict)


def pytest_sessionfinish(session, exitstatus):
    # pytest-xdist's workers report to the controller, which sees every test: it alone decides
    if hasattr(session.config, "workerinput"):
        return
    if SLOWEST.verdict() and exitstatus == 0:
        session.exitstatus = 1
