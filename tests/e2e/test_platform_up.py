"""The README's first command, for real: ``python -m runner up`` (what
``./platform up`` runs) starts Airflow with login, deploys and feeds every example stream
through its DAGs, and on Ctrl-C stops them gracefully, validates what they wrote and
prints a summary per stream whose sinks equal the generator's ground truth."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_harness import ARTIFACTS, CHROMIUM_FLAGS, free_port, sign_in, stream_drivers, wait_for

from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_specs

pytestmark = pytest.mark.e2e


def open_every_stream_page(url: str, password: str, chromium: str, tables: dict[str, str]) -> None:
    """An operator's first clicks, in a real browser: each example stream's page, the Kafka and Delta
    example's with its Delta table's figures (once the table exists), each kept as a screenshot."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        errors: list[str] = []  # a script that failed, or one the pages' Content-Security-Policy refused
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
        sign_in(page, url, "admin", password)
        for stream in ("clicks", "sensors"):
            response = page.goto(f"{url}/streams/{stream}/?range=15m")
            assert response is not None and response.status == 200, (stream, response and response.status)
            page.locator("#chart-rates .main-svg").first.wait_for(timeout=60_000)
            page.locator("#streams-flow .plot .sankey").first.wait_for(timeout=60_000)
            if stream == "clicks":
                for output in tables:
                    cell = page.locator(f"td:text-is('{output}')")
                    row = page.locator("h2#tables + table tr", has=cell).first.inner_text()
                    assert "no table yet" not in row and re.search(r"\s\d+\s+\d+\s+\d+\s", row), row
            page.screenshot(path=str(ARTIFACTS / f"stream-{stream}-page.png"), full_page=True)
        browser.close()
    assert not errors, errors


@pytest.mark.browser
def test_platform_up_runs_every_stream_and_shuts_down_cleanly_on_ctrl_c(tmp_path: Path, chromium: str) -> None:
    data_root = tmp_path / "platform"
    specs, errors = load_specs(default_spec_dir())
    assert specs and not errors
    port = free_port()
    out = tmp_path / "up.log"
    proc = subprocess.Popen([sys.executable, "-m", "runner", "up", "--port", str(port), "--data-root",
                             str(data_root), "--rate", "0.5", "--events-per-file", "20", "--minutes", "20"],
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        layouts = {name: Layout(spec, data_root, default_spec_dir()) for name, spec in specs.items()}

        def every_stream_committed() -> bool:
            plans = [compile_plan(specs[n], layouts[n]) for n in specs]
            return all(len(batch_ids(plan.checkpoint(plan.flows[0]), "commits")) >= 3 for plan in plans)

        wait_for(lambda: every_stream_committed() or proc.poll() is not None,
                 "every stream to commit three batches", timeout=420, every=2)
        assert proc.poll() is None, out.read_text()[-3000:]
        text = out.read_text()
        assert f"Airflow UI     http://127.0.0.1:{port}" in text
        first = next(line for line in text.splitlines() if line.startswith("[") and "backlog" in line)
        assert ": dead" not in first, f"a stream just deployed is starting, not dead: {first}"
        passwords = json.loads((data_root / "airflow" / "passwords.json").read_text())
        assert passwords["admin"] and passwords["admin"] != "admin"  # generated, not a well-known default
        home = data_root / "airflow"
        assert home.stat().st_mode & 0o077 == 0, "the Airflow home is for its user alone"
        for secret in (home / "passwords.json", home / "api-server.log", home / "airflow.db"):
            assert secret.stat().st_mode & 0o077 == 0, f"{secret} is readable by others"
        tables = compile_plan(specs["clicks"], layouts["clicks"]).delta_tables
        wait_for(lambda: all((Path(t) / "_delta_log").is_dir() for t in tables.values()),
                 "the clicks stream's Delta tables to exist", timeout=300, every=2)
        open_every_stream_page(f"http://127.0.0.1:{port}", passwords["admin"], chromium, tables)

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(900) == 0, out.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)

    text = out.read_text()
    print(text[-4000:])
    assert "shutting down gracefully" in text and "==> shut down in" in text
    assert passwords["admin"] not in text  # the password is in its file, never on the terminal
    assert "[Stage " not in text and "log4j" not in text, "Spark's console output reached the terminal"
    assert stream_drivers() == []
    summary = json.loads((data_root / "summary.json").read_text())
    assert set(summary["streams"]) == set(specs)
    for name, s in summary["streams"].items():
        assert s["ground_truth_equal"], (name, [sink["detail"] for sink in s["sinks"]])
        assert s["outputs_agree"], (name, s["disagreements"])
        assert s["quality_ok"], (name, s)
        assert s["expected"]["input_records"] > 0 and s["quarantined"] == s["expected"]["quarantined"]
        assert sum(v["validated"] for v in s["validated"].values()) >= 1, (name, s["validated"])
        assert all(b["status"] in ("balanced", "not checkable") for b in s["accounting"]["balances"]), s["accounting"]
        assert f"{name}:" in text and "every sink equals the ground truth: yes" in text
        # validation followed new output: the sinks' asset events ran the quality DAG on their own
        assert s["quality_runs"]["asset_triggered"] >= 1, (name, s["quality_runs"])
        assert s["validation_delay_seconds"]["units"] >= 1, (name, s["validation_delay_seconds"])
    runs = json.loads((layouts["sensors"].lease_dir / "runs.json").read_text())
    assert runs[-1]["exit_code"] == 0  # stopped on request, between batches
