"""The per-stream data-quality summary: ``<data root>/quality/<stream>/index.html`` (and ``summary.json``).

Every validated unit with pass or fail, its rows and what failed, newest first, with a
link to its Data Docs page; backfilled ranges; the latest accounting. Rebuilt from the
ledger after every validation run; the Airflow UI serves it (``plugins/streams_ui.py``).
"""

from __future__ import annotations

import json
import os
from html import escape
from pathlib import Path
from typing import Any

from spark_jobs.quality.ledger import Ledger
from spark_jobs.spec import StreamSpec

SHOWN_UNITS = 300

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
.passed{color:#126b12}.failed{color:#b00020;font-weight:600}.muted{color:#666}"""


def summary(spec: StreamSpec, ledger: Ledger) -> dict[str, Any]:
    outputs = {}
    for name, entry in ledger.data["outputs"].items():
        units = list(entry["units"].values())
        outputs[name] = {
            "validated": len(units) + sum(entry["pruned"].values()),
            "passed": sum(u["status"] == "passed" for u in units) + entry["pruned"]["passed"],
            "failed": sum(u["status"] == "failed" for u in units) + entry["pruned"]["failed"],
            "latest": units[-1] if units else None,
        }
    runs = ledger.data["runs"]
    last = runs[-1] if runs else None
    accounting = next((r["accounting"] for r in reversed(runs) if r.get("accounting")), None)
    return {"stream": spec.name, "outputs": outputs, "last_run": last, "accounting": accounting,
            "ok": bool(last and last["ok"])}


def _unit_rows(units: list[dict[str, Any]], docs_prefix: str) -> str:
    rows = []
    for u in units[:SHOWN_UNITS]:
        link = f' <a href="{docs_prefix}{escape(u["docs"])}">result</a>' if u.get("docs") else ""
        failed = "<br>".join(escape(f) for f in u["failed"]) or '<span class="muted">-</span>'
        rows.append(f'<tr><td>{escape(u["unit"])}</td><td class="{u["status"]}">{u["status"]}</td>'
                    f'<td>{u["rows"]}</td><td>{failed}</td><td>{escape(u["validated_at"])}{link}</td></tr>')
    return "".join(rows)


def render(spec: StreamSpec, ledger: Ledger) -> str:
    s = summary(spec, ledger)
    head = "<tr><th>unit</th><th>result</th><th>rows</th><th>failed checks</th><th>validated</th></tr>"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Data quality: {spec.name}</title>"
             f"<style>{STYLE}</style></head><body><h1>Data quality of stream <code>{spec.name}</code></h1>",
             '<p><a href="docs/index.html">Great Expectations Data Docs</a></p>']
    acc = s["accounting"]
    if acc:
        state = "passed" if acc["ok"] else "failed"
        parts.append(f"<h2>Accounting <span class='{state}'>{'balances' if acc['ok'] else 'FAILS'}</span></h2>"
                     f"<p>{acc['input']} input rows, {acc['quarantined']} quarantined "
                     f"({acc['quarantine_rate']:.2%}; threshold {acc['max_quarantine_rate']:.2%})</p><table>"
                     "<tr><th>output</th><th>status</th><th>input</th><th>accepted</th><th>quarantined</th>"
                     "<th>duplicates</th><th>dropped late</th><th>note</th></tr>")
        for b in acc["balances"]:
            cls = "failed" if b["status"] == "unbalanced" else "passed" if b["status"] == "balanced" else "muted"
            accepted = "-" if b["accepted"] is None else b["accepted"]
            parts.append(f"<tr><td>{b['output']}</td><td class='{cls}'>{b['status']}</td><td>{b['input']}</td>"
                         f"<td>{accepted}</td><td>{b['quarantined']}</td><td>{b['duplicates']}</td>"
                         f"<td>{b['dropped_late']}</td><td>{escape(b['message'])}</td></tr>")
        parts.append("</table>")
    for name, entry in ledger.data["outputs"].items():
        o = s["outputs"][name]
        units = sorted(entry["units"].values(), key=lambda u: u["unit"], reverse=True)
        parts.append(f"<h2>{name}</h2><p>{o['validated']} unit(s) validated: {o['passed']} passed, "
                     f"<span class='{'failed' if o['failed'] else 'muted'}'>{o['failed']} failed</span>"
                     f"{f' (newest {SHOWN_UNITS} shown)' if len(units) > SHOWN_UNITS else ''}</p>"
                     f"<table>{head}{_unit_rows(units, 'docs/')}</table>")
    for name, ranges in ledger.data["backfills"].items():
        units = sorted(ranges.values(), key=lambda u: u["unit"], reverse=True)
        parts.append(f"<h2>{name}: backfills</h2><table>{head}{_unit_rows(units, 'docs/')}</table>")
    parts.append("</body></html>")
    return "".join(parts)


def write_summary(spec: StreamSpec, ledger: Ledger, directory: Path, docs_index: Path) -> Path:
    """Write the page and its JSON; ``docs/`` beside them links to the Data Docs site."""
    directory.mkdir(parents=True, exist_ok=True)
    docs = directory / "docs"
    if not docs.is_symlink():
        docs.symlink_to(os.path.relpath(docs_index.parent, directory), target_is_directory=True)
    for name, text in (("index.html", render(spec, ledger)),
                       ("summary.json", json.dumps(summary(spec, ledger), indent=1, default=str))):
        tmp = directory / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, directory / name)
    return directory / "index.html"
