"""The summary of a run per stream (what ``./platform up`` prints at the end and writes to
``<data root>/summary.json``): rows in, accepted, quarantined, duplicates, dropped late, rows per
sink against the generator's ground truth, restarts, units validated and how soon after they
closed, whether the accounting balances."""

from __future__ import annotations

import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from runner.processes import output_to
from spark_jobs.plan import StreamPlan
from spark_jobs.quality.closing import validation_delays
from spark_jobs.quality.ledger import read_ledger
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import StreamSpec


def verify_sinks(specs: dict[str, StreamSpec], spec_dir: Path, data_root: Path) -> dict[str, Any]:
    """Per stream (its spec in ``spec_dir``, its data under ``data_root``), every sink against the
    generator's ground truth and every output against its query over the accepted rows: what a
    Spark session of its own reads (the sinks, once the streams stopped;
    :class:`runner.platform.Platform` runs it while the validation and Airflow's stop go on).
    Each stream's plan is resolved once, with Spark (a transform's columns)."""
    from runner.testdata import verify
    from spark_jobs.analysis import resolve_plan
    from spark_jobs.runtime.session import build_session

    with output_to(data_root / "logs" / "summary-spark.log"):  # the JVM keeps writing there, not here
        spark = build_session("platform-summary", master="local[1]",
                              extra={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    verified: dict[str, Any] = {}
    try:
        for name, spec in sorted(specs.items()):
            plan = resolve_plan(spark, spec, Layout(spec, data_root, spec_dir))
            manifest_path = data_root / "generated" / name / "manifest.json"
            manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
            report = verify.compare(spark, plan, manifest) if manifest else None
            agreement = verify.agreement(spark, plan) if plan.ingestion is not None else []
            verified[name] = {
                "expected": manifest["counts"] if manifest else None,
                "sinks": [{"output": o.name, "rows": o.actual, "expected": o.expected, "equal": o.ok,
                           "detail": o.describe()} for o in (report.outputs if report else [])],
                "quarantined": report.quarantined if report else None,
                "ground_truth_equal": bool(report and report.ok),
                "outputs_agree": all(r.ok for r in agreement),
                "disagreements": [r.describe() for r in agreement if not r.ok],
            }
    finally:
        spark.stop()
    return verified


def summarize(plans: dict[str, StreamPlan], layouts: dict[str, Layout], started_at: float,
              quality_runs: dict[str, list[dict[str, Any]]], verified: dict[str, Any]) -> dict[str, Any]:
    """Per stream (its plan, and its layout for the control files): the accounting measured by the
    quality DAG, every sink against the ground truth (``verified``: :func:`verify_sinks`' answer),
    restarts since ``started_at`` and the units validated; ``quality_runs``: the quality DAGs' runs."""
    from streamops.restarts import RestartBudget

    result: dict[str, Any] = {"started_at": started_at, "ended_at": time.time(), "streams": {}}
    for name, plan in sorted(plans.items()):
        layout = layouts[name]
        quality_path = layout.quality_dir / "summary.json"
        quality = json.loads(quality_path.read_text()) if quality_path.exists() else {}
        budget = RestartBudget(layout.runs_file, plan.supervision.restart)
        delays = sorted(validation_delays(plan, read_ledger(layout.quality_dir), since=started_at))
        runs = quality_runs.get(name, [])
        result["streams"][name] = {
            **verified[name],
            "restarts": budget.restarts_since(started_at),
            "validated": {o: {k: v[k] for k in ("validated", "passed", "failed")}
                          for o, v in quality.get("outputs", {}).items()},
            "accounting": quality.get("accounting"),
            "quality_ok": quality.get("ok"),
            "quality_runs": {kind: sum(r.get("run_type") == kind for r in runs)
                             for kind in ("asset_triggered", "manual", "scheduled")},
            "validation_delay_seconds": {
                "units": len(delays), "median": statistics.median(delays) if delays else None,
                "max": delays[-1] if delays else None},
        }
    return result


def describe_summary(summary: dict[str, Any]) -> list[str]:
    """The summary as the lines printed at the end of a run."""
    lines = []
    for name, s in summary["streams"].items():
        lines.append(f"{name}:")
        e = s["expected"]
        if e:
            lines.append(f"  generated: {e['input_records']} rows in = {e['accepted']} accepted + {e['quarantined']} "
                         f"quarantined + {e['duplicates']} duplicates + {e['dropped_late']} dropped late")
        acc = s["accounting"]
        for b in (acc or {}).get("balances", []):
            accepted = "?" if b["accepted"] is None else b["accepted"]
            lines.append(f"  measured {b['output']}: {b['input']} in = {accepted} accepted + {b['quarantined']} "
                         f"quarantined + {b['duplicates']} duplicates + {b['dropped_late']} dropped late: {b['status']}")
        for sink in s["sinks"]:
            lines.append(f"  sink {sink['detail']}")
        lines.append(f"  quarantine: {s['quarantined']} rows")
        validated = ", ".join(f"{o} {v['validated']} ({v['passed']} passed, {v['failed']} failed)"
                              for o, v in s["validated"].items()) or "nothing yet"
        lines.append(f"  restarts: {s['restarts']}; units validated: {validated}")
        runs, delay = s.get("quality_runs") or {}, s.get("validation_delay_seconds") or {}
        if runs:
            lines.append(f"  quality DAG runs: {runs.get('asset_triggered', 0)} on new output (asset events), "
                         f"{runs.get('manual', 0)} triggered, {runs.get('scheduled', 0)} on the clock")
        if delay.get("units"):
            lines.append(f"  from a unit closing to its validation: median {delay['median']:.0f} s, "
                         f"max {delay['max']:.0f} s ({delay['units']} unit(s))")
        for d in s.get("disagreements", []):
            lines.append(f"  DISAGREES with the accepted rows: {d}")
        lines.append(f"  every sink equals the ground truth: {'yes' if s['ground_truth_equal'] else 'NO'}; "
                     f"every output equals its query over the accepted rows: "
                     f"{'yes' if s.get('outputs_agree') else 'NO'}; "
                     f"data quality: {'passed' if s['quality_ok'] else 'FAILED or not run'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.summary --spec-dir D --data-root R --out F``: :func:`verify_sinks` in a
    process of its own (its JVM's output stays out of the runner's terminal), its answer in ``F``."""
    import argparse

    from spark_jobs.stream_spec.loading import load_specs

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--spec-dir", type=Path, required=True)
    p.add_argument("--data-root", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    specs, _errors = load_specs(args.spec_dir)
    args.out.write_text(json.dumps(verify_sinks(specs, args.spec_dir, args.data_root), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

