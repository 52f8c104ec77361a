"""The driver's start followed as a newcomer follows it: where the stream's spec (or what was
compiled from it) goes, module by module, from ``stream_job`` until its flows start."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from spark_jobs import plan as plan_module
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import StreamSpec

SENSORS = default_spec_dir() / "sensors.yaml"
#: the driver's start: the first call that starts the stream's flows
STARTS = {"start_planned", "start_ingestion_first"}


def _carries_the_spec(value: object) -> bool:
    """The spec itself, or anything compiled from it (the plan and its parts, all dataclasses of ``spark_jobs.plan``)."""
    if isinstance(value, StreamSpec):
        return True
    return dataclasses.is_dataclass(value) and type(value).__module__ == plan_module.__name__


class SpecTrail:
    """The project's modules the spec visits, in order (a module once per consecutive visit): each
    call of a ``spark_jobs`` function given the spec or what was compiled from it, until the flows start."""

    def __init__(self) -> None:
        self.modules: list[str] = []
        self.started = False

    def __call__(self, frame, event: str, _arg: object) -> None:
        if event != "call" or self.started:
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("spark_jobs."):
            return
        code = frame.f_code
        if code.co_name in STARTS:
            self.started = True
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if any(_carries_the_spec(frame.f_locals.get(n)) for n in names if n != "self"):
            if not self.modules or self.modules[-1] != module:
                self.modules.append(module)

    @property
    def returns(self) -> list[str]:
        """The visits to a module the spec had left before."""
        return [m for i, m in enumerate(self.modules) if m in self.modules[:i]]


def test_the_spec_goes_one_way_through_the_driver_s_start(spark, tmp_path: Path, monkeypatch) -> None:
    from spark_jobs import stream_job

    spec = load_spec(SENSORS)
    layout = Layout(spec, tmp_path, default_spec_dir())
    landing = Path(plan_module.compile_plan(spec, layout).source.landing)
    landing.mkdir(parents=True)
    (landing / "part-0.json").write_text("".join(json.dumps(
        {"event_id": f"e{i}", "device_id": "dev-001", "ts": f"2026-01-01T00:0{i}:00Z", "temperature": 20.0 + i})
        + "\n" for i in range(5)), encoding="utf-8")
    monkeypatch.setattr("spark_jobs.runtime.session.build_session", lambda *a, **kw: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)  # the shared session outlives the job
    trail = SpecTrail()
    sys.setprofile(trail)
    try:
        code = stream_job.main(["--spec", str(SENSORS), "--data-root", str(tmp_path), "--trigger", "available-now"])
    finally:
        sys.setprofile(None)
    assert code == stream_job.EXIT_OK and trail.started
    print(f"{len(trail.modules)} visits of {len(set(trail.modules))} modules, {len(trail.returns)} returns: "
          + " > ".join(m.removeprefix("spark_jobs.") for m in trail.modules))
    assert len(trail.returns) <= 15, trail.modules
