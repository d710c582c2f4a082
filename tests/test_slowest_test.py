"""The bound on the slowest test (tests/slowest_test.py) fails a run that goes over it and names the test."""

from types import SimpleNamespace

import pytest

import slowest_test
from slowest_test import SlowestTest


def report(nodeid, duration):
    return SimpleNamespace(nodeid=nodeid, duration=duration)


def test_a_test_over_the_bound_is_named_with_its_time_and_the_bound():
    slowest = SlowestTest(bound=10)
    for nodeid, when in [("t.py::a", (3, 2, 0.1)), ("t.py::b", (4, 5.5, 1)), ("t.py::c", (0.2, 30, 0))]:
        for duration in when:  # set-up, call and tear-down add up
            slowest.add(report(nodeid, duration))
    assert [n for _, n in slowest.over()] == ["t.py::c", "t.py::b"]
    lines = slowest.verdict().splitlines()
    assert lines[0].startswith("t.py::c took 30.2 s, over the 10 s any one test may take")
    assert lines[1].startswith("t.py::b took 10.5 s")
    assert all("HF_ATTN_SLOWEST_TEST_S" in line for line in lines)


def test_no_verdict_when_every_test_keeps_under_the_bound():
    slowest = SlowestTest(bound=10)
    slowest.add(report("t.py::a", 9.9))
    assert slowest.over() == [] and slowest.verdict() is None


def test_the_session_fails_only_on_the_controller(monkeypatch):
    monkeypatch.setattr(slowest_test, "SLOWEST", SlowestTest(bound=1))
    slowest_test.pytest_runtest_logreport(report("t.py::slow", 2))
    controller = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    slowest_test.pytest_sessionfinish(controller, 0)
    assert controller.exitstatus == 1
    worker = SimpleNamespace(config=SimpleNamespace(workerinput={}), exitstatus=0)
    slowest_test.pytest_sessionfinish(worker, 0)
    assert worker.exitstatus == 0
    failed = SimpleNamespace(config=SimpleNamespace(), exitstatus=2)  # an already failing run keeps its status
    slowest_test.pytest_sessionfinish(failed, 2)
    assert failed.exitstatus == 2


def test_the_bound_reads_the_environment(monkeypatch):
    monkeypatch.setenv("HF_ATTN_SLOWEST_TEST_S", "120")
    assert slowest_test.bound_s() == 120
    monkeypatch.delenv("HF_ATTN_SLOWEST_TEST_S")
    assert slowest_test.bound_s() == slowest_test.BOUND_S
    monkeypatch.setenv("HF_ATTN_SLOWEST_TEST_S", "two minutes")
    with pytest.raises(SystemExit, match="is not a number of seconds"):
        slowest_test.bound_s()


def test_conftest_registers_the_hooks(monkeypatch):
    import conftest

    for hook in ("pytest_runtest_logreport", "pytest_terminal_summary"):
        assert getattr(conftest, hook) is getattr(slowest_test, hook)
    # conftest's own session-finish hook (which also unfreezes the garbage collector) hands on to the bound's
    monkeypatch.setattr(slowest_test, "SLOWEST", SlowestTest(bound=1))
    monkeypatch.setattr(conftest.gc, "unfreeze", lambda: None)  # (the rest of this run stays frozen)
    slowest_test.pytest_runtest_logreport(report("t.py::slow", 2))
    controller = SimpleNamespace(config=SimpleNamespace(), exitstatus=0)
    conftest.pytest_sessionfinish(controller, 0)
    assert controller.exitstatus == 1
