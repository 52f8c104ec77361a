"""A Kafka source outside Spark: its bootstrap servers, whether the broker and topics are
there, its end offsets, and how many records a stream is behind, per partition.

The stream's offsets come from its ingestion's checkpoint: the offsets log entry of the
newest committed batch (``{"topic": {"partition": offset}}``, where that batch read up
to, exclusive). The broker's come from its end offsets (the next offset a producer
writes). No pyspark here: the sensors and the Streams page use it too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.plan import KafkaPlan
from spark_jobs.runtime.checkpoint import last_batch, source_offsets

#: how long a probe of the broker waits for an answer
PROBE_SECONDS = 10.0


class KafkaUnavailable(RuntimeError):
    """The broker does not answer, or a topic the stream reads does not exist: a situation to
    wait out and restart from (not a bad spec), diagnosed with the spec's field."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def _expanded(text: str, field: str) -> str:
    """``text`` with ``${VAR}`` read from this process's environment (where secrets belong);
    :class:`KafkaUnavailable` naming ``field`` (never the value) if a variable is not set."""
    expanded = os.path.expandvars(text)
    unset = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", expanded)
    if unset:
        raise KafkaUnavailable(field, f"environment variable(s) {unset} not set")
    return expanded


def servers(text: str, field: str = "source.bootstrap_servers") -> str:
    """Bootstrap servers with ``${VAR}`` read from this process's environment."""
    if "$" not in text:
        return text
    try:
        return _expanded(text, field)
    except KafkaUnavailable as exc:
        raise KafkaUnavailable(exc.field, f"{exc.message} (the spec says {text!r})") from None


def connection_env(connection: str) -> str:
    """The environment variable that hands a driver the bootstrap servers of an Airflow
    connection (the supervisor resolves the connection; a driver has no Airflow of its own)."""
    return "STREAMS_KAFKA_BOOTSTRAP_" + re.sub(r"[^A-Za-z0-9]", "_", connection).upper()


def from_connection(connection: str) -> str | None:
    """The bootstrap servers an Airflow connection says (its extra's ``bootstrap.servers``, as
    Airflow's Kafka provider keeps them, else ``host:port``), or None if it cannot be read here."""
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(connection)
    except Exception:  # no Airflow here, or no such connection: the caller says so
        return None
    extra = conn.extra_dejson or {}
    found = extra.get("bootstrap.servers") or extra.get("bootstrap_servers")
    if not found and conn.host:
        found = f"{conn.host}:{conn.port}" if conn.port else conn.host
    return str(found) if found else None


def bootstrap_servers(kafka: KafkaPlan) -> str:
    """A Kafka source's bootstrap servers: ``${VAR}`` read from this process's environment,
    or its Airflow connection's (handed to a driver in :func:`connection_env`)."""
    if kafka.connection is None:
        assert kafka.bootstrap_servers is not None
        return servers(kafka.bootstrap_servers)
    found = os.environ.get(connection_env(kafka.connection)) or from_connection(kafka.connection)
    if not found:
        raise KafkaUnavailable("source.connection", f"the Airflow connection {kafka.connection!r} cannot be read "
                                                    "here or says no bootstrap.servers (extra) or host")
    return found


def source_options(options: dict[str, str]) -> dict[str, str]:
    """The spec's other source options (Spark's reader options) with ``${VAR}`` expanded: a
    SASL password stays in the environment, never in the spec or the plan."""
    return {k: _expanded(v, f"source.options.{k}") if "$" in v else v for k, v in options.items()}


def client_config(kafka: KafkaPlan | str, options: dict[str, str] | None = None) -> dict[str, Any]:
    """A confluent-kafka client's settings: the bootstrap servers (a source's, or expanded
    already), and the ``kafka.*`` options of the spec (security settings, say) without their
    prefix."""
    config: dict[str, Any] = {"bootstrap.servers": kafka if isinstance(kafka, str) else bootstrap_servers(kafka),
                              "log_level": 0}
    for key, value in source_options(options or {}).items():
        if key.startswith("kafka."):
            config[key.removeprefix("kafka.")] = value
    return config


def named(kafka: KafkaPlan) -> str:
    """How messages name a source's brokers: as the spec writes them (``${KAFKA_BOOTSTRAP_SERVERS}``),
    or its Airflow connection; never the value a variable or connection expands to, which may hold
    a credential and names hosts that a viewer of a page need not see."""
    if kafka.connection is not None:
        return f"the brokers of Airflow connection {kafka.connection!r}"
    return str(kafka.bootstrap_servers)


def _scrubbed(text: str, bootstrap: str, name: str) -> str:
    """``text`` (a client library's error) with the expanded servers, each of them and their parts
    (a user, a password, a host and port) as ``name``."""
    servers = [s.strip() for s in bootstrap.split(",")]
    parts = {p for s in servers for p in (s, s.rsplit("@", 1)[-1], *re.split(r"[@/]", s))}
    parts |= {p for p in re.split(r"[,@/:]", bootstrap) if len(p) >= 6 or "." in p}
    for value in sorted((p for p in parts if p and p != name), key=len, reverse=True):
        text = text.replace(value, name)
    return text


def topics_on(bootstrap: str, options: dict[str, str] | None = None, timeout: float = PROBE_SECONDS,
              field: str = "source.bootstrap_servers", name: str | None = None) -> dict[str, int]:
    """Every topic the broker at ``bootstrap`` (expanded) has, with its partition count;
    :class:`KafkaUnavailable` naming ``field`` if it does not answer within ``timeout``. ``name``:
    how the message names the brokers (the spec's unexpanded text, :func:`named`); without one,
    it names the field alone."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    name = name or field
    try:
        metadata = AdminClient(client_config(bootstrap, options)).list_topics(timeout=timeout)
    except KafkaException as exc:
        said = _scrubbed(str(exc.args[0].str() if exc.args else exc), bootstrap, name)
        raise KafkaUnavailable(field, f"no Kafka broker answered at {name} within {timeout:.0f}s ({said})") from None
    return {topic: len(t.partitions) for topic, t in metadata.topics.items() if t.error is None}


def missing_topic(topic: str, name: str, field: str) -> KafkaUnavailable:
    """``name``: the brokers as the spec names them (:func:`named`), never expanded."""
    return KafkaUnavailable(field, f"topic {topic!r} does not exist on {name} (create it; the platform does not)")


def probe(kafka: KafkaPlan, options: dict[str, Any] | None = None, timeout: float = PROBE_SECONDS) -> dict[str, int]:
    """The partitions of each topic the source reads; :class:`KafkaUnavailable` naming the
    field if the broker does not answer within ``timeout`` or a named topic does not exist."""
    bootstrap = bootstrap_servers(kafka)
    topics = topics_on(bootstrap, options, timeout, name=named(kafka))
    if kafka.topics:
        for i, topic in enumerate(kafka.topics):
            if topic not in topics:
                raise missing_topic(topic, named(kafka), f"source.topics[{i}]")
        return {t: topics[t] for t in kafka.topics}
    pattern = re.compile(kafka.pattern or "")
    return {t: n for t, n in topics.items() if pattern.fullmatch(t)}


def end_offsets(kafka: KafkaPlan, partitions: dict[str, int], options: dict[str, Any] | None = None,
                timeout: float = PROBE_SECONDS) -> dict[tuple[str, int], tuple[int, int]]:
    """The broker's first and end offset (low and high watermark) of every partition of
    ``partitions`` (topic -> count)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(client_config(kafka, options) | {"group.id": "streams-lag-probe",
                                                         "enable.auto.commit": False})
    try:
        return {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout, cached=False)
                for t, n in sorted(partitions.items()) for p in range(n)}
    except KafkaException as exc:  # a partition without a leader, a broker gone meanwhile
        said = _scrubbed(str(exc.args[0].str() if exc.args else exc), bootstrap_servers(kafka), named(kafka))
        raise KafkaUnavailable("source.bootstrap_servers", f"the brokers of {named(kafka)} did not say their end "
                                                           f"offsets within {timeout:.0f}s ({said})") from None
    finally:
        consumer.close()


def committed_offsets(checkpoint: str | os.PathLike[str]) -> dict[tuple[str, int], int]:
    """Where the newest committed batch of the query whose checkpoint this is read up to,
    per topic partition; empty before its first commit."""
    batch = last_batch(checkpoint, "commits")
    offsets = source_offsets(checkpoint, batch) if batch is not None else None
    if not isinstance(offsets, dict):
        return {}
    return {(topic, int(p)): int(o) for topic, parts in offsets.items() if isinstance(parts, dict)
            for p, o in parts.items()}


@dataclass
class Lag:
    """How many records the stream is behind the broker, per topic partition."""

    behind: dict[tuple[str, int], int] = field(default_factory=dict)
    #: partitions the broker has that the checkpoint does not know yet (added while running)
    new_partitions: list[tuple[str, int]] = field(default_factory=list)
    #: records deleted before the stream read them (retention, a recreated topic): per
    #: partition, the first offset gone and the first still there
    lost: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.behind.values())

    def by_partition(self) -> dict[str, int]:
        """``{"topic/partition": records}``, as the Streams page and the events show it."""
        return {f"{t}/{p}": n for (t, p), n in sorted(self.behind.items())}

    def lost_text(self) -> str | None:
        """What was deleted unread, for an operator: ``offsets 0 to 7 of clicks/0``; None if nothing."""
        if not self.lost:
            return None
        parts = [f"offsets {a} to {b - 1} of {t}/{p}" for (t, p), (a, b) in sorted(self.lost.items())]
        return (f"records were deleted from the topic before the stream read them ({', '.join(parts)}): "
                "retention removed them while the stream was behind or stopped, or the topic was recreated")


def lag(kafka: KafkaPlan, checkpoint: str | os.PathLike[str], options: dict[str, Any] | None = None,
        timeout: float = PROBE_SECONDS) -> Lag:
    """Records behind per partition: the broker's end offset minus where the newest
    committed batch read up to. A partition the checkpoint does not know counts from where
    Spark will start it: its first offset (a partition added while running, or any before
    the first commit of an ``earliest`` stream), else its end. Where the checkpoint points
    below the partition's first offset, the records between were deleted unread (``lost``)."""
    partitions = probe(kafka, options, timeout)
    ends = end_offsets(kafka, partitions, options, timeout)
    committed = committed_offsets(checkpoint)
    result = Lag()
    for key, (low, high) in ends.items():
        if key in committed:
            result.behind[key] = max(0, high - max(committed[key], low))
            if committed[key] < low:
                result.lost[key] = (committed[key], low)
            continue
        if committed:
            result.new_partitions.append(key)
        from_start = bool(committed) or kafka.starting_offsets == "earliest"
        result.behind[key] = high - low if from_start else 0
    return result
