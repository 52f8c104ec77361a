"""The README's first command, for real: ``python -m runner up`` (what
``./platform up`` runs) starts Airflow with login, deploys and feeds every example stream
through its DAGs, and on Ctrl-C stops them gracefully, validates what they wrote and
prints a summary per stream whose sinks equal the generator's ground truth. Meanwhile an
operator signs in with a real headless Chromium (Playwright driving the system's Chromium) and
goes through the Streams pages (without Chromium the test says what is missing, and fails on
CI)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
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


def ingested_batch(page) -> int:  # a Playwright page on the overview
    """The sensors ingestion's last committed batch as the overview shows it."""
    match = re.search(r"(?:^|\s)_ingest: (\d+)", page.locator("tr[data-stream='sensors']").inner_text())
    return int(match.group(1)) if match else -1


def open_every_stream_page(url: str, password: str, chromium: str, tables: dict[str, str]) -> None:
    """An operator's first clicks, in a real browser: nothing without a login; the overview, which
    follows the streams' new batches; each example stream's page with its charts and flow graph
    (its status row refreshed in place), the Kafka and Delta example's with its Delta table's figures
    (once the table exists); an action from a page (its CSRF token, the browser's own Origin).
    Screenshots kept in ``test-artifacts/``."""
    from playwright.sync_api import sync_playwright

    with pytest.raises(urllib.error.HTTPError) as anonymous:  # no login, no data
        urllib.request.urlopen(f"{url}/streams/api/status", timeout=10)
    assert anonymous.value.code == 401
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page()
        errors: list[str] = []  # a script that failed, or one the pages' Content-Security-Policy refused
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text
                or "Refused to" in m.text else None)
        page.goto(f"{url}/streams/")
        assert "Not authenticated" in page.content()
        sign_in(page, url, "admin", password)

        page.goto(f"{url}/streams/")
        page.locator(".trend[data-stream='sensors'] .main-svg").first.wait_for(timeout=60_000)
        before = ingested_batch(page)
        assert before >= 0

        def newer() -> bool:  # the streams are fed all along
            page.reload()
            return ingested_batch(page) > before

        wait_for(newer, "the overview to show a newer committed batch", timeout=300, every=3)
        page.screenshot(path=str(ARTIFACTS / "streams-page.png"), full_page=True)

        for stream in ("clicks", "sensors"):
            response = page.goto(f"{url}/streams/{stream}/?range=15m")
            assert response is not None and response.status == 200, (stream, response and response.status)
            # drawn by Plotly (served by the plugin, allowed by the pages' policy) from the history the
            # driver and supervisor keep
            for chart in ("rates", "durations", "lag", "state", "quarantine") if stream == "sensors" else ("rates",):
                page.locator(f"#chart-{chart} .main-svg").first.wait_for(timeout=60_000)
            assert page.locator("#chart-rates .scatterlayer .trace").count() >= 2  # input and processed drawn
            page.locator("#streams-flow .plot .sankey").first.wait_for(timeout=60_000)
            ingestion = page.locator("#streams-flow table.nodes tr[data-node='ingestion'] td")
            assert int(ingestion.nth(1).inner_text()) > 0, "rows into the ingestion over the range"
            if stream == "clicks":
                for output in tables:
                    cell = page.locator(f"td:text-is('{output}')")
                    row = page.locator("h2#tables + table tr", has=cell).first.inner_text()
                    assert "no table yet" not in row and re.search(r"\s\d+\s+\d+\s", row), row
            page.screenshot(path=str(ARTIFACTS / f"stream-{stream}-page.png"), full_page=True)
        # the stream's status row refreshes in place (no page reload, which would lose a half-filled form)
        page.evaluate("document.querySelector('tr[data-row-url]').dataset.seen = 'yes'")
        page.locator("tr[data-row-url]:not([data-seen])").wait_for(timeout=40_000)

        # an action from the page itself goes through: one that leaves the stream running
        page.get_by_role("button", name="validate").click()
        page.wait_for_url(re.compile(r".*triggered=stream_sensors_quality.*"), timeout=60_000)
        assert "Triggered: stream_sensors_quality" in page.content()
        browser.close()
    assert not errors, errors
    assert (ARTIFACTS / "streams-page.png").stat().st_size > 10_000


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
        wait_for(lambda: all(any((Path(t) / "_delta_log").glob("*.json")) for t in tables.values()),
                 "the clicks stream's Delta tables to have a first version", timeout=300, every=2)
        open_every_stream_page(f"http://127.0.0.1:{port}", passwords["admin"], chromium, tables)

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(900) == 0, out.read_text()[-5000:]
    finally:
        if proc.poll() is None:  # the test failed: Ctrl-C twice, a shutdown without waiting for the streams,
            for _ in range(2):  # which stops Airflow too (its services run in sessions of their own)
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
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
