"""Where a stream's files live: its spec's relative paths resolved against the data root and
the spec folder, and its control files beside the checkpoint."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from spark_jobs.stream_spec.models import TRANSFORMS_DIR, StreamSpec, TableSink


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def default_spec_dir() -> Path:
    return Path(os.environ.get("STREAMS_SPEC_DIR", project_root() / "include" / "streams"))


def default_data_root() -> Path:
    return Path(os.environ.get("STREAMS_DATA_DIR", project_root() / "data"))


class Layout:
    """A stream's roots and control files: the data root and the specs' folder that its spec's
    relative paths resolve against, and the control files beside its checkpoint. Everything
    else the platform derives from a spec (each flow's checkpoint, the landing folder, the
    sinks, where the accepted rows live) is in the stream's plan (``spark_jobs.plan``)."""

    def __init__(self, spec: StreamSpec, data_root: str | os.PathLike[str] | None = None,
                 spec_dir: str | os.PathLike[str] | None = None):
        self.stream = spec.name
        self.checkpoint = spec.checkpoint  # as the spec says it
        self.data_root = (Path(data_root) if data_root is not None else default_data_root()).resolve()
        self.spec_dir = Path(spec_dir) if spec_dir is not None else default_spec_dir()

    @property
    def shared_driver_queue(self) -> Path:
        """The queue of the data root's shared driver (``spark_jobs/shared_driver.py``): every
        stream's scheduled runs that may go there, whichever worker asks."""
        return self.data_root / "_shared_driver" / "queue"

    def data(self, path: str) -> str:
        if "://" in path or os.path.isabs(path):
            return path
        return str((self.data_root / path).resolve())

    @property
    def transforms_dir(self) -> Path:
        """The Python queries' modules: ``include/transforms/`` beside ``include/streams/``."""
        return (self.spec_dir.parent / TRANSFORMS_DIR).resolve()

    def reference(self, path: str) -> str:
        """Reference data paths are relative to the folder holding the specs' folder."""
        if "://" in path or os.path.isabs(path):
            return path
        return str((self.spec_dir.parent / path).resolve())

    def include(self, path: str) -> str:
        """A path in ``include/`` (an application's main file); a URL that spark-submit fetches as it is."""
        if re.match(r"^[a-z][a-z0-9+.-]*://", path):
            return path
        return str((self.spec_dir.parent / path).resolve())

    @property
    def checkpoint_root(self) -> str:
        return self.data(self.checkpoint)

    @property
    def stop_marker(self) -> Path:
        return Path(self.checkpoint_root) / "_control" / "stop"

    @property
    def lease_dir(self) -> Path:
        return Path(self.checkpoint_root) / "_control"

    @property
    def runs_file(self) -> Path:
        """The supervisor's history of runs (restart budget)."""
        return self.lease_dir / "runs.json"

    @property
    def hold_marker(self) -> Path:
        """Present while the stream is stopped on purpose: the supervisor does not restart it."""
        return self.lease_dir / "hold"

    @property
    def quality_dir(self) -> Path:
        """Rules' results, ledger, reports and Data Docs of the stream's validations."""
        return Path(self.data(f"quality/{self.stream}"))

    @property
    def maintenance_dir(self) -> Path:
        """The results of the upkeep of the stream's Delta tables (``spark_jobs.maintenance``)."""
        return Path(self.data(f"maintenance/{self.stream}"))

    def backfill_dir(self, output: str) -> Path:
        """Where the backfills of an output go, one ``range=...`` folder per range."""
        return Path(self.data(f"backfill/{self.stream}/{output}"))

    @property
    def per_trigger_file(self) -> Path:
        """What a micro-batch of the ingestion may take, as sizing by lag last set it (``spark_jobs.runtime.rate_limit``)."""
        return self.lease_dir / "per_trigger.json"

    @property
    def records_behind_file(self) -> Path:
        """A Kafka stream's records behind, as the supervisor last measured them against the broker
        (``streamops.health``): what the pages show, never asking the broker themselves."""
        return self.lease_dir / "records_behind.json"

    @property
    def plans_dir(self) -> Path:
        """Every plan the stream started with, one file per start, with its spec's text (``spark_jobs.changes``)."""
        return self.lease_dir / "plans"

    @property
    def retired_dir(self) -> Path:
        """The checkpoints of outputs removed from the spec, archived when the next start retired them."""
        return self.lease_dir / "retired"

    @property
    def state_file(self) -> Path:
        """What the stream's state held at a committed batch, per flow and stateful operator, as the
        last inspection read it (``spark_jobs.state``)."""
        return self.lease_dir / "state.json"

    @property
    def plan_file(self) -> Path:
        """The plan the running job works from (spark_jobs.plan), written when it starts."""
        return self.lease_dir / "plan.json"

    @property
    def events_file(self) -> Path:
        return Path(self.checkpoint_root) / "_events" / "progress.jsonl"

    @property
    def history_file(self) -> Path:
        """The numbers the stream's charts draw (spark_jobs.runtime.history), kept for days at bounded size."""
        return Path(self.checkpoint_root) / "_events" / "history.sqlite"

    def table_url(self, sink: TableSink) -> str:
        url = os.path.expandvars(sink.url) if sink.url else os.environ.get("STREAMS_DB_URL", "")
        if not url:
            url = f"sqlite:///{self.data_root / 'tables.db'}"
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            rel = url.removeprefix("sqlite:///")
            if not os.path.isabs(rel):
                url = f"sqlite:///{(self.data_root / rel).resolve()}"
        return url


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log)."""
    if "://" not in url:  # a libpq key=value string
        return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", url, flags=re.IGNORECASE)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{host}"
    query = "&".join(
        f"{piece.split('=', 1)[0]}=***" if piece.split("=", 1)[0].lower() == "password" else piece
        for piece in parts.query.split("&")
    )
    return (f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if parts.query else "")
            + (f"#{parts.fragment}" if parts.fragment else ""))
