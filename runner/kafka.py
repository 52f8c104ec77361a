"""A real Apache Kafka broker on loopback, for ``./platform up`` and the tests.

One JVM in KRaft mode (broker and controller in one process), on the class path that
``./platform setup`` fetched from Maven Central (``.jars/kafka-broker/``, never Spark's):
its storage formatted once (``kafka.tools.StorageTool``), then ``kafka.Kafka`` started and
waited for through an admin client, not a sleep. Replication factor 1 for the internal
topics (offsets, transactions, share groups), as one node needs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from runner.processes import PRIVATE, free_port, private_log, wait_until

ROOT = Path(__file__).resolve().parents[1]
#: where ``./platform setup`` puts the broker's jars (``include/deploy/maven/kafka-broker.xml``)
BROKER_JARS = ROOT / ".jars" / "kafka-broker"

LOG4J2 = """\
status = error
appender.file.type = Console
appender.file.name = OUT
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class BrokerError(RuntimeError):
    """The broker could not be set up or started; the message says why and where its log is."""


def broker_classpath(jars: Path = BROKER_JARS) -> str:
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise BrokerError(f"no Kafka broker jars in {jars}: run ./platform setup (it fetches them with mvn)")
    return str(jars / "*")


class KafkaBroker:
    """A single-node Kafka broker whose data and log live in ``home``.

    :param home: its folder (``server.properties``, ``data/``, ``broker.log``); its storage
        is formatted at the first start there.
    :param port: the client port on 127.0.0.1 (default: a free one); the controller takes another.
    """

    def __init__(self, home: Path, port: int | None = None, heap: str = "512m"):
        self.home = Path(home)
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap = heap
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.home / "broker.log"

    def _java(self, main: str, *args: str) -> list[str]:
        return ["java", f"-Xmx{self.heap}", f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                "-cp", broker_classpath(), main, *args]

    def _configure(self) -> Path:
        data = self.home / "data"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(data),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",  # a topic a spec names must exist: a typo is an error, not a new topic
        }
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.properties").write_text(LOG4J2)
        return config

    def start(self, timeout: float = 60) -> KafkaBroker:
        """Format the storage (the first time), start the broker and wait until it answers."""
        config = self._configure()
        old_umask = os.umask(PRIVATE)
        try:
            if not (self.home / "data" / "meta.properties").exists():
                cluster = subprocess.run(self._java("kafka.tools.StorageTool", "random-uuid"), check=True,
                                         capture_output=True, text=True).stdout.strip()
                formatted = subprocess.run(
                    self._java("kafka.tools.StorageTool", "format", "--standalone", "-t", cluster, "-c", str(config)),
                    capture_output=True, text=True)
                if formatted.returncode != 0:
                    raise BrokerError(f"formatting the broker's storage in {self.home} failed: "
                                      f"{formatted.stderr.strip() or formatted.stdout.strip()}")
            with private_log(self.log_file) as log:
                self.proc = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            os.umask(old_umask)
        if not wait_until(self._ready, timeout, every=0.2, interrupted=lambda: self.proc.poll() is not None):
            code = self.proc.poll()
            self.stop()
            tail = self.log_file.read_text(errors="replace")[-2000:]
            raise BrokerError(f"the Kafka broker in {self.home} did not start"
                              f"{f' (exit {code})' if code is not None else f' within {timeout:.0f}s'}; "
                              f"its log ({self.log_file}) ends:\n{tail}")
        return self

    def _ready(self) -> bool:
        """Does the broker answer an admin client (asked once its port accepts connections)?"""
        from confluent_kafka.admin import AdminClient

        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            AdminClient(self.client_config()).list_topics(timeout=5)
        except Exception:  # not answering yet
            return False
        return True

    def client_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "log_level": 3}

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic ``name`` (it must not exist) and wait until every partition has a leader."""
        if not ensure_topics(self.bootstrap, [name], partitions):
            raise BrokerError(f"topic {name} exists already on {self.bootstrap}")

    def add_partitions(self, name: str, total: int) -> None:
        from confluent_kafka.admin import AdminClient, NewPartitions

        admin = AdminClient(self.client_config())
        admin.create_partitions([NewPartitions(name, total)])[name].result(timeout=60)

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the records of ``topic``'s ``partition`` below offset ``before``, as retention does."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.client_config())
        for future in admin.delete_records([TopicPartition(topic, partition, before)]).values():
            future.result(timeout=60)

    def produce(self, topic: str, values: list[bytes | str | None], partition: int | None = None,
                keys: list[bytes | str | None] | None = None) -> None:
        """Produce ``values`` in order (to ``partition``, else by key or round robin) and wait
        until the broker has every one."""
        from confluent_kafka import KafkaException, Producer

        producer = Producer(self.client_config() | {"enable.idempotence": True, "linger.ms": 5})
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for i, value in enumerate(values):
            kwargs: dict[str, Any] = {"value": value, "on_delivery": delivered}
            if partition is not None:
                kwargs["partition"] = partition
            if keys is not None:
                kwargs["key"] = keys[i]
            producer.produce(topic, **kwargs)
            producer.poll(0)
        if producer.flush(60) or errors:
            raise KafkaException(f"producing to {topic} failed: {errors[:3] or 'not delivered within 60 s'}")

    def consume(self, topic: str, timeout: float = 30) -> list[Any]:
        """Every record ``topic`` holds now (confluent-kafka ``Message`` objects), read from the
        start of each partition up to its end offset when called."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(self.client_config() | {"group.id": f"read-{topic}", "enable.auto.commit": False})
        try:
            partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in partitions}
            consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
            found: list[Any] = []
            left = {p for p, end in ends.items() if end > 0}
            deadline = time.monotonic() + timeout
            while left and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and not message.error():
                    found.append(message)
                # the position, not the last record's offset: a transaction's commit marker takes an offset too
                for tp in consumer.position([TopicPartition(topic, p) for p in left]):
                    if tp.offset >= ends[tp.partition]:
                        left.discard(tp.partition)
            if left:
                raise BrokerError(f"read only part of {topic} within {timeout:.0f}s (partitions {sorted(left)} not to "
                                  "their end)")
            return found
        finally:
            consumer.close()

    def stop(self, timeout: float = 30) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown; SIGKILL after ``timeout``)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for_topic(bootstrap: str, topic: str, timeout: float = 30) -> bool:
    """Has the broker a leader for every partition of ``topic`` (within ``timeout``)?"""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})

    def ready() -> bool:
        meta = admin.list_topics(topic, timeout=2).topics.get(topic)
        return bool(meta and meta.error is None and meta.partitions
                    and all(p.leader >= 0 for p in meta.partitions.values()))

    return bool(wait_until(ready, timeout, every=0.1))


def ensure_topics(bootstrap: str, topics: list[str], partitions: int, timeout: float = 60) -> list[str]:
    """Create those of ``topics`` that the broker at ``bootstrap`` lacks (``partitions`` each,
    replication factor 1) and wait until each has a leader for every partition; the ones
    created. One that exists is left as it is."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise BrokerError(f"no Kafka broker answered at {bootstrap}: {exc}") from None
    wanted = [t for t in topics if t not in existing]
    if not wanted:
        return []
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1) for t in wanted],
                                  operation_timeout=30)
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout)
            if not wait_for_topic(bootstrap, topic, timeout):
                raise BrokerError(f"topic {topic} has no leader for every partition {timeout:.0f} s after it was created")
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"creating topic {topic} on {bootstrap} failed: {exc}") from None
    return sorted(created)
