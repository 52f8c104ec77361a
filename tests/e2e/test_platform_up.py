"""The README's first command, for real: ``python -m runner up`` (what
``./platform up`` runs) starts Airflow with login, deploys and feeds every example stream
through its DAGs, and on Ctrl-C stops them gracefully, validates what they wrote and
prints a summary per stream whose sinks equal the generator's ground truth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from airflow_harness import free_port, stream_drivers, wait_for

from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids
from spark_jobs.spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.spec.loading import load_specs

pytestmark = pytest.mark.e2e


def test_platform_up_runs_every_stream_and_shuts_down_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    data_root = tmp_path / "platform"
    specs, errors = load_specs(default_spec_dir())
    assert specs and not errors
    port = free_port()
    out = tmp_path / "up.log"
    proc = subprocess.Popen([sys.executable, "-m", "runner", "up", "--port", str(port), "--data-root",
                             str(data_root), "--rate", "0.5", "--events-per-file", "20", "--minutes", "20"],
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, start_new_session=True)  # noqa: SIM115
    try:
        layouts = {name: Layout(spec, data_root, default_spec_dir()) for name, spec in specs.items()}

        def every_stream_committed() -> bool:
            plans = [compile_plan(specs[n], layouts[n]) for n in specs]
            return all(len(batch_ids(plan.checkpoint(plan.queries[0]), "commits")) >= 3 for plan in plans)

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
