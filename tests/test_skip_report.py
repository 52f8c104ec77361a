"""How a test run reports skips (tests/conftest.py), proven on small suites run by pytester.

Every skipped test is listed at the end with its reason; a skip for a missing system
package (PostgreSQL server binaries, Chromium) fails the run unless STREAMS_ALLOW_SKIPS=1;
on CI such a test fails outright.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # here only: no other test needs it

CONFTEST = Path(__file__).with_name("conftest.py")
SUITE = """
import pytest

def test_runs():
    pass

def test_needs_postgres(missing_system_package):
    missing_system_package("no PostgreSQL server binaries (initdb, pg_ctl, postgres)")

@pytest.mark.skip(reason="only on a Spark cluster")
def test_plain_skip():
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_known_bug():
    assert False
"""
POSTGRES = "SKIPPED test_suite.py::test_needs_postgres: missing system package: no PostgreSQL server binaries"
PLAIN = "SKIPPED test_suite.py::test_plain_skip: only on a Spark cluster"


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("STREAMS_ALLOW_SKIPS", raising=False)
    pytester.makeconftest(CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_a_skip_for_a_missing_system_package_fails_the_run_and_every_skip_is_listed(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-ra")  # as pyproject.toml's addopts
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # at the end, after pytest's own short summary (which folds skips with the same reason into one line)
    result.stdout.fnmatch_lines(["*short test summary info*", "*= skipped tests (2) =*", f"{POSTGRES}*", PLAIN,
                                 "1 skipped for a missing system package: the suite did not fully run, so the run "
                                 "fails.*STREAMS_ALLOW_SKIPS=1*", "*= 1 passed, 2 skipped, 1 xfailed in *"])
    assert "test_known_bug" not in result.stdout.str().split("skipped tests (2)")[1]  # an xfail is no skip


def test_streams_allow_skips_lets_the_run_pass_and_still_lists_the_skips(suite: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMS_ALLOW_SKIPS", "1")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*= skipped tests (2) =*", f"{POSTGRES}*", PLAIN,
                                 "1 skipped for a missing system package, allowed by STREAMS_ALLOW_SKIPS=1"])


def test_other_skips_are_listed_but_do_not_fail_the_run(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("-k", "not needs_postgres")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*= skipped tests (1) =*", PLAIN])
    result.stdout.no_fnmatch_line("*missing system package*")


def test_on_ci_a_missing_system_package_fails_the_test_itself(suite: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "1")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*CI is set, so the tests that need it must run: missing system package: no PostgreSQL*"])


def test_a_failing_run_keeps_its_own_exit_status(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_broken="def test_broken():\n    assert False\n")
    result = suite.runpytest_subprocess()
    result.assert_outcomes(passed=1, skipped=2, xfailed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    interrupted = suite.runpytest_subprocess("test_suite.py", "does_not_exist.py")
    assert interrupted.ret == pytest.ExitCode.USAGE_ERROR
