"""The per-stream data-quality summary: ``<data root>/quality/<stream>/index.html`` (and ``summary.json``).

Every validated unit with pass or fail, its rows and what failed, newest first, with a
link to its Data Docs page; backfilled ranges; the latest accounting. Rebuilt from the
ledger after every validation run; the Airflow UI serves it (``plugins/streams_ui.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from spark_jobs.quality.ledger import Ledger
from spark_jobs.runtime.atomic import write_atomically

SHOWN_UNITS = 300

#: the page's HTML (``templates/summary.html``); every value put in is escaped
PAGES = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                    autoescape=select_autoescape(["html"]), trim_blocks=True, lstrip_blocks=True,
                    undefined=StrictUndefined)


def summary(stream: str, ledger: Ledger) -> dict[str, Any]:
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
    return {"stream": stream, "outputs": outputs, "last_run": last, "accounting": accounting,
            "ok": bool(last and last["ok"])}


def render(stream: str, ledger: Ledger) -> str:
    s = summary(stream, ledger)

    def newest_first(units: Any) -> list[dict[str, Any]]:
        return sorted(units, key=lambda u: u["unit"], reverse=True)

    outputs = [(name, s["outputs"][name], newest_first(entry["units"].values()))
               for name, entry in ledger.data["outputs"].items()]
    backfills = [(name, newest_first(ranges.values())) for name, ranges in ledger.data["backfills"].items()]
    return PAGES.get_template("summary.html").render(stream=stream, accounting=s["accounting"], outputs=outputs,
                                                     backfills=backfills, shown=SHOWN_UNITS)


def write_summary(stream: str, ledger: Ledger, directory: Path, docs_index: Path) -> Path:
    """Write the page and its JSON; ``docs/`` beside them links to the Data Docs site."""
    directory.mkdir(parents=True, exist_ok=True)
    docs = directory / "docs"
    if not docs.is_symlink():
        docs.symlink_to(os.path.relpath(docs_index.parent, directory), target_is_directory=True)
    for name, text in (("index.html", render(stream, ledger)),
                       ("summary.json", json.dumps(summary(stream, ledger), indent=1, default=str))):
        write_atomically(directory / name, text)
    return directory / "index.html"
