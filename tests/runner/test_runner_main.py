"""``python -m runner up`` (what ``./platform up`` runs): its options and what it refuses before
starting anything."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runner.__main__ import main, parser
from runner.processes import free_port
from spark_jobs.plan import compile_plan
from spark_jobs.stream_spec.layout import Layout, default_spec_dir, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import ParquetSink


def test_up_options_and_their_defaults() -> None:
    args = parser().parse_args(["up"])
    assert (args.command, args.minutes, args.port, args.rate, args.events_per_file, args.master, args.fresh) == (
        "up", None, 8080, 0.5, 40, "local[2]", False)
    assert args.data_root == project_root() / "data" / "platform" and args.spec_dir == default_spec_dir()


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == 2 and "required: COMMAND" in capsys.readouterr().err


def test_minutes_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["up", "--minutes", "0", "--port", str(free_port())])
    assert exit_.value.code == 2 and "./platform up: error: --minutes must be positive" in capsys.readouterr().err


def test_a_port_in_use_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(SystemExit) as exit_:
            main(["up", "--port", str(s.getsockname()[1])])
    assert exit_.value.code == 2 and "is in use; choose another with --port" in capsys.readouterr().err


def test_no_specs_no_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "specs").mkdir()
    code = main(["up", "--port", str(free_port()), "--spec-dir", str(tmp_path / "specs"),
                 "--data-root", str(tmp_path / "data")])
    assert code == 2 and f"error: no specs in {tmp_path / 'specs'}" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_data_written_by_other_specs_is_refused_before_anything_starts(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A data root whose clicks.views_per_minute went to Parquet files, before the example's Delta table."""
    spec = load_spec(default_spec_dir() / "clicks.yaml")
    data = tmp_path / "data"
    layout = Layout(spec, data, default_spec_dir())
    sink = ParquetSink(type="parquet", path="sinks/clicks/views_per_minute")
    earlier = spec.model_copy(update={"outputs": [spec.outputs[0].model_copy(update={"sink": sink}), *spec.outputs[1:]]})
    compile_plan(earlier, Layout(earlier, data, default_spec_dir())).write(layout.plan_file)
    commits = Path(compile_plan(spec, layout).checkpoint("views_per_minute")) / "commits"
    commits.mkdir(parents=True)
    (commits / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    code = main(["up", "--port", str(free_port()), "--data-root", str(data)])
    err = capsys.readouterr().err
    assert code == 2 and "stream clicks: its spec changed in ways its checkpoint" in err
    assert "output views_per_minute: rebuild" in err and 'sink.kind: the sink moved from parquet to delta' in err
    assert f"error: {data} holds data that these specs cannot resume from; `./platform up --fresh` discards it" in err
    assert not (data / "airflow").exists() and not (data / "logs").exists()


def test_the_platform_script_runs_the_runner() -> None:
    assert 'exec "$VENV/bin/python" -m runner up "$@"' in (project_root() / "platform").read_text()


def test_help_as_a_module() -> None:
    result = subprocess.run([sys.executable, "-m", "runner", "up", "--help"], capture_output=True, text=True,
                            check=True, cwd="/")
    assert result.stdout.startswith("usage: ./platform up") and "--minutes MINUTES" in result.stdout
    assert "The whole platform on one machine" in result.stdout
