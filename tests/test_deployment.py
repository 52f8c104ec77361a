"""The container deployment, checked without a container engine: compose file, image, secrets."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
SERVICES = COMPOSE["services"]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def pinned(package: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in deps if re.split(r"[\[=]", d)[0] == package)


def test_every_platform_service_is_there() -> None:
    assert {"postgres", "redis", "airflow-api-server", "airflow-scheduler", "airflow-worker", "airflow-dag-processor",
            "airflow-triggerer", "spark-master", "spark-worker"} <= set(SERVICES)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(name: str) -> None:
    service = SERVICES[name]
    assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for dependency, condition in (service.get("depends_on") or {}).items():
        assert dependency in SERVICES
        assert condition == {"condition": "service_healthy"}, f"{name} does not wait for {dependency} to be healthy"


def test_airflow_runs_on_postgres_and_celery_and_streams_on_the_spark_cluster() -> None:
    airflow_services = [n for n in SERVICES if n.startswith("airflow-")]
    for name in airflow_services:  # one configuration for all, as in Airflow's own compose file
        env = SERVICES[name]["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://")
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
        assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://:${REDIS_PASSWORD}@redis:6379/0"
        assert {"postgres", "redis"} <= set(SERVICES[name]["depends_on"])
    assert '"host": "spark://spark-master:7077"' in env["AIRFLOW_CONN_SPARK_STREAMS"]
    assert "Worker spark://spark-master:7077" in SERVICES["spark-worker"]["command"][-1]
    for name in ("spark-master", "spark-worker", "redis", "airflow-worker"):  # the entrypoints take bash -c
        assert SERVICES[name]["command"][:2] == ["bash", "-c"]
    for name in ("airflow-worker", "airflow-scheduler", "airflow-api-server", "spark-worker"):  # all see the data
        assert "streams-data:/opt/streams/data" in SERVICES[name]["volumes"]


def test_workers_scale_take_the_streams_queue_and_the_broker_is_private() -> None:
    worker = SERVICES["airflow-worker"]
    assert "container_name" not in worker and "hostname" not in worker, "replicas need hostnames of their own"
    assert "airflow celery worker --queues" in worker["command"][-1]
    example = dict(line.split("=", 1) for line in (ROOT / ".env_example").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    assert "streams" in example["AIRFLOW_WORKER_QUEUES"].split(",")  # the specs' default supervision.queue
    assert "redis-server - <<< \"requirepass $${REDIS_PASSWORD}" in SERVICES["redis"]["command"][-1]
    assert "ports" not in SERVICES["redis"]
    assert pinned("apache-airflow-providers-celery")


def test_the_pinned_celery_provider_loads_its_executor() -> None:
    """What `airflow celery worker` and the scheduler import first (a Celery release once broke it)."""
    from airflow.providers.celery.executors.celery_executor import CeleryExecutor, app

    assert CeleryExecutor.__name__ == "CeleryExecutor" and app.main


def test_mounted_files_and_build_files_exist() -> None:
    for name, service in SERVICES.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in COMPOSE["volumes"], f"{name} uses an undeclared volume {source}"
        if "build" in service:
            assert (ROOT / service["build"] / "Dockerfile").exists()
    for source in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", DOCKERFILE, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"the Dockerfile copies {path}, which does not exist"


def test_the_image_pins_the_versions_of_pyproject() -> None:
    assert f"ARG AIRFLOW_VERSION={pinned('apache-airflow')}" in DOCKERFILE
    assert "ARG PYTHON_VERSION=3.11" in DOCKERFILE
    assert 'pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -e .' in DOCKERFILE
    assert re.search(r"^USER airflow$", DOCKERFILE, re.M) and DOCKERFILE.rstrip().rfind("USER root") < DOCKERFILE.rfind("USER airflow")


def test_no_secret_is_written_in_the_compose_file() -> None:
    secretish = re.compile(r"(PASSWORD|SECRET|KEY|TOKEN)", re.I)

    def walk(node, where: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and secretish.search(str(k)):
                    assert re.fullmatch(r"\$\{\w+\}", v), f"{where}.{k} holds a literal value, not ${{VARIABLE}}"
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")
        elif isinstance(node, str):
            assert not re.search(r"://[^:/@\s]+:(?!\$\{)[^@\s]+@", node), f"{where} has credentials in a URL"

    walk(COMPOSE, "compose")
    example = (ROOT / ".env_example").read_text()
    for line in example.splitlines():
        if "=" in line and not line.startswith("#") and secretish.search(line.split("=")[0]):
            assert re.fullmatch(r"<[a-z-]+>", line.split("=", 1)[1]), f".env_example must hold placeholders: {line}"
    assert "/.env" in (ROOT / ".gitignore").read_text().splitlines()
    ports = [p for s in SERVICES.values() for p in s.get("ports", [])]
    assert all(p.startswith("127.0.0.1:") for p in ports), "published ports listen on loopback unless changed"


def test_a_kafka_broker_inside_the_network_and_the_connector_baked_into_the_image() -> None:
    kafka = SERVICES["kafka"]
    assert kafka["image"].startswith("apache/kafka:4.")
    assert "ports" not in kafka, "the broker is for the compose network only"
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert SERVICES["airflow-worker"]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    # the same Maven definition as ./platform setup, into the folder the drivers' --jars read
    assert "include/deploy/maven/spark-connectors.xml dependency:copy-dependencies" in DOCKERFILE
    assert "-DoutputDirectory=/opt/streams/.jars/spark-connectors" in DOCKERFILE


def test_prometheus_scrapes_the_streams_metrics_with_the_token_and_alerts_on_what_the_plugin_exports() -> None:
    """The compose file's Prometheus: its scrape configuration and alert rules exist and parse, it
    scrapes the path the plugin serves with the token the API server accepts (a secret, not a
    literal), and its rules name only metrics, labels and statuses the plugin exports
    (``streamops.metrics``). Checked as YAML (``promtool`` is not at hand here)."""
    from streamops import STREAMS_URL, metrics

    prometheus = SERVICES["prometheus"]
    assert re.fullmatch(r"prom/prometheus:v\d+\.\d+\.\d+", prometheus["image"]), "pin Prometheus to a release"
    assert "./include/deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert prometheus["depends_on"] == {"airflow-api-server": {"condition": "service_healthy"}}
    assert all(p.startswith("127.0.0.1:") for p in prometheus["ports"])
    config = yaml.safe_load((ROOT / "include/deploy/prometheus/prometheus.yml").read_text())
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]

    (job,) = [j for j in config["scrape_configs"] if j["metrics_path"] == STREAMS_URL + metrics.PATH]
    assert [t for c in job["static_configs"] for t in c["targets"]] == ["airflow-api-server:8080"]
    assert job.get("scrape_interval", config["global"]["scrape_interval"]) == "15s"
    # the token: the compose secret made from STREAMS_METRICS_TOKEN, which the API server reads from .env
    secret = job["authorization"]["credentials_file"]
    assert job["authorization"]["type"] == "Bearer" and secret.startswith("/run/secrets/")
    name = secret.removeprefix("/run/secrets/")
    assert name in prometheus["secrets"] and COMPOSE["secrets"][name] == {"environment": metrics.TOKEN_ENV}
    assert SERVICES["airflow-api-server"]["env_file"] == ".env"
    example = dict(line.split("=", 1) for line in (ROOT / ".env_example").read_text().splitlines()
                   if "=" in line and not line.startswith("#"))
    assert example[metrics.TOKEN_ENV] == "<random-secret>"

    # the alert rules: loaded by Prometheus, stalled, lagging and quality covered, over exported metrics
    (rules_file,) = config["rule_files"]
    assert rules_file.startswith("/etc/prometheus/")
    rules = yaml.safe_load((ROOT / "include/deploy/prometheus" / rules_file.removeprefix("/etc/prometheus/"))
                           .read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"]}
    assert {"StreamStalled", "StreamLagging", "StreamQualityFailed"} <= set(alerts)
    labels = {label for m in metrics.METRICS for label in m.labels}
    for alert, rule in alerts.items():
        expr = rule["expr"]
        used = set(re.findall(r"\bstreams_\w+", expr))
        assert used or expr.startswith("up{"), (alert, expr)
        assert used <= metrics.NAMES, f"{alert} names metrics the plugin does not export: {sorted(used - metrics.NAMES)}"
        for label, values in re.findall(r"\b(\w+)=~?\"([^\"]*)\"", expr):
            if label == "job":
                assert values == job["job_name"], alert
                continue
            assert label in labels, (alert, label)
            if label == "status":
                assert set(values.split("|")) <= set(metrics.STATUSES), (alert, values)
        for label in re.findall(r"\$labels\.(\w+)", str(rule["annotations"])):
            assert label in labels, (alert, label)
    assert "streams_status" in alerts["StreamStalled"]["expr"] and '"stalled"' in alerts["StreamStalled"]["expr"]
    assert '"lagging"' in alerts["StreamLagging"]["expr"]
    assert "streams_validation_ok" in alerts["StreamQualityFailed"]["expr"]
