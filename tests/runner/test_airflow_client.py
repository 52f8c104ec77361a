"""The one client of Airflow's REST API, against a stand-in API server on loopback: login and
token refresh, the calls the platform makes, retries of what may be sent twice, errors."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runner.airflow import AirflowClient, AirflowServices, json_lines
from runner.processes import free_port


class FakeAirflow:
    """Answers a few of Airflow's API paths; ``fail``: (method, path) -> statuses to answer first."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []  # method, path, headers, body
        self.fail: dict[tuple[str, str], list[int]] = {}
        self.tokens = 0
        self.valid_token: str | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, method: str, path: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
        if self.fail.get((method, path.split("?")[0])):
            return self.fail[(method, path.split("?")[0])].pop(0), {"detail": "not now"}
        if path == "/auth/token" and method == "POST":
            if body != {"username": "ops", "password": "secret"}:
                return 401, {"detail": "Invalid credentials"}
            self.tokens += 1
            self.valid_token = f"token-{self.tokens}"
            return 201, {"access_token": self.valid_token}
        if path == "/api/v2/monitor/health":
            return 200, {"metadatabase": {"status": "healthy"}}
        if self.valid_token is not None and headers.get("Authorization") != f"Bearer {self.valid_token}":
            return 401, {"detail": "Token expired"}
        if path.startswith("/api/v2/dags?"):
            return 200, {"dags": [{"dag_id": "stream_a"}, {"dag_id": "stream_a_stop"}], "total_entries": 2}
        if path.startswith("/api/v2/dags/stream_a/dagRuns?"):
            return 200, {"dag_runs": [{"dag_run_id": "manual__2", "state": "running", "run_type": "manual"}]}
        if path == "/api/v2/dags/stream_a/dagRuns" and method == "POST":
            return 200, {"dag_run_id": "manual__3", "conf": body["conf"]}
        if path == "/api/v2/dags/stream_a/dagRuns/manual__2" and method == "PATCH":
            return 200, {"dag_run_id": "manual__2", "state": body["state"]}
        if path == "/api/v2/dags/stream_a/dagRuns/manual__2%2Bx%2Fy":
            return 200, {"dag_run_id": "manual__2+x/y", "state": "success"}
        if path == "/api/v2/dags/stream_a" and method == "PATCH":
            return 200, {"dag_id": "stream_a", "is_paused": body["is_paused"]}
        if path.startswith("/api/v2/importErrors"):
            return 200, {"import_errors": [{"filename": "dags/x.py", "stack_trace": "boom"}], "total_entries": 1}
        if path == "/api/v2/empty":
            return 204, None
        return 404, {"detail": "Not Found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append((self.command, self.path, dict(self.headers), body))
                status, answer = fake.answer(self.command, self.path, body, dict(self.headers))
                data = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def calls(self, method: str, path: str) -> int:
        return sum(m == method and p.split("?")[0] == path for m, p, _, _ in self.requests)


@pytest.fixture
def airflow() -> Iterator[FakeAirflow]:
    fake = FakeAirflow()
    thread = threading.Thread(target=fake.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_the_platforms_calls_as_a_logged_in_user(airflow: FakeAirflow) -> None:
    client = AirflowClient(airflow.url, "ops", "secret")
    assert client.healthy()
    assert client.dag_ids() == {"stream_a", "stream_a_stop"}
    assert client.runs("stream_a") == [{"run_id": "manual__2", "dag_run_id": "manual__2", "state": "running",
                                        "run_type": "manual"}]
    assert client.trigger("stream_a", {"mode": "graceful"}) == "manual__3"
    client.unpause("stream_a")
    assert client.run("stream_a", "manual__2+x/y")["state"] == "success"  # the run id quoted as one segment
    assert client.import_errors() == [{"filename": "dags/x.py", "stack_trace": "boom"}]
    assert client.get("empty") is None
    assert airflow.tokens == 1, "one login serves every call"
    trigger = next(r for r in airflow.requests if r[0] == "POST" and r[1].endswith("/dagRuns"))
    assert trigger[3] == {"logical_date": None, "conf": {"mode": "graceful"}}
    runs = next(r for r in airflow.requests if r[1].startswith("/api/v2/dags/stream_a/dagRuns?"))
    assert "order_by=-run_after" in runs[1] and "limit=100" in runs[1]  # newest first
    # a DAG stopped as from the UI: paused first (no new run), then its running run marked failed
    del airflow.requests[:]
    assert client.stop_dag("stream_a") == ["manual__2"]
    assert [(m, path.split("?")[0], body) for m, path, _, body in airflow.requests] == [
        ("PATCH", "/api/v2/dags/stream_a", {"is_paused": True}), ("GET", "/api/v2/dags/stream_a/dagRuns", None),
        ("PATCH", "/api/v2/dags/stream_a/dagRuns/manual__2", {"state": "failed"})]


def test_an_expired_token_is_replaced_once(airflow: FakeAirflow) -> None:
    client = AirflowClient(airflow.url, "ops", "secret")
    client.dag_ids()
    airflow.valid_token = "rotated"  # the server no longer accepts the client's token
    assert client.dag_ids() == {"stream_a", "stream_a_stop"}
    assert airflow.tokens == 2


def test_wrong_credentials_are_an_error(airflow: FakeAirflow) -> None:
    with pytest.raises(RuntimeError, match="login as ops: HTTP 401"):
        AirflowClient(airflow.url, "ops", "wrong").dag_ids()


def test_without_a_user_no_login_is_attempted(airflow: FakeAirflow) -> None:
    """An Airflow whose every request is an admin needs no token (the benchmarks', the tests')."""
    assert AirflowClient(airflow.url).dag_ids() == {"stream_a", "stream_a_stop"}
    assert airflow.tokens == 0
    assert all("Authorization" not in headers for _, _, headers, _ in airflow.requests)


def test_server_errors_are_retried_for_what_may_be_sent_twice(airflow: FakeAirflow) -> None:
    client = AirflowClient(airflow.url)
    airflow.fail[("GET", "/api/v2/dags")] = [503]
    airflow.fail[("PATCH", "/api/v2/dags/stream_a")] = [502]
    assert client.dag_ids() == {"stream_a", "stream_a_stop"}
    client.unpause("stream_a")
    assert airflow.calls("GET", "/api/v2/dags") == 2 and airflow.calls("PATCH", "/api/v2/dags/stream_a") == 2

    airflow.fail[("POST", "/api/v2/dags/stream_a/dagRuns")] = [503]
    with pytest.raises(RuntimeError, match=r"POST /api/v2/dags/stream_a/dagRuns: HTTP 503"):
        client.trigger("stream_a")  # not sent again: that could start a second run
    assert airflow.calls("POST", "/api/v2/dags/stream_a/dagRuns") == 1


def test_an_error_names_the_call_and_what_airflow_said(airflow: FakeAirflow) -> None:
    with pytest.raises(RuntimeError, match=r"GET /api/v2/nowhere: HTTP 404 b'\{\"detail\": \"Not Found\"\}'"):
        AirflowClient(airflow.url).get("nowhere")


def test_no_server_is_an_os_error_and_not_healthy() -> None:
    client = AirflowClient(f"http://127.0.0.1:{free_port()}", retries=0)
    assert not client.healthy()
    with pytest.raises(OSError):
        client.dag_ids()


def test_services_call_the_api_as_their_first_user_with_the_generated_password(airflow: FakeAirflow,
                                                                               tmp_path: Path) -> None:
    passwords = tmp_path / "passwords.json"
    services = AirflowServices(tmp_path / "home", tmp_path / "data", port=int(airflow.url.rsplit(":", 1)[1]),
                               users="ops:admin,viewer:viewer", passwords_file=passwords)
    passwords.write_text(json.dumps({"ops": "secret", "viewer": "other"}))  # as the API server writes it
    assert services.healthy()
    assert services.dag_ids() == {"stream_a", "stream_a_stop"}
    assert services.runs("stream_a")[0]["run_id"] == "manual__2"
    assert services.trigger("stream_a") == "manual__3"
    assert services.import_errors() == [{"filename": "dags/x.py", "stack_trace": "boom"}]
    assert airflow.tokens == 1


def test_services_environment(tmp_path: Path) -> None:
    services = AirflowServices(tmp_path / "home", tmp_path / "data", port=18080,
                               extra_env={"AIRFLOW__CORE__DAGS_FOLDER": "/elsewhere"})
    assert services.url == "http://127.0.0.1:18080"
    assert services.env["AIRFLOW__API__HOST"] == "127.0.0.1" and services.env["AIRFLOW__API__PORT"] == "18080"
    assert services.env["AIRFLOW__CORE__DAGS_FOLDER"] == "/elsewhere"  # extra_env wins
    assert services.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path / 'home'}/airflow.db"
    assert services.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(tmp_path / "home" / "passwords.json")
    assert json.loads(services.env["AIRFLOW_CONN_SPARK_STREAMS"]) == {"conn_type": "spark", "host": "local[2]"}


def test_json_lines_takes_the_list_after_the_log_lines() -> None:
    assert json_lines('[2025-01-01] INFO - loading\n[{"dag_id": "a"}]\n') == [{"dag_id": "a"}]
    assert json_lines("nothing\n") == []
