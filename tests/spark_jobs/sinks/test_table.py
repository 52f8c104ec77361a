"""The table sink's database layer: idempotent batches on SQLite and PostgreSQL."""

from __future__ import annotations

import pickle
import threading
from collections import namedtuple
from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from spark_jobs.sinks.table import (
    SQL_TYPES,
    TableWriter,
    open_database,
    redact,
)
from spark_jobs.stream_spec.models import SPARK_TYPES

COLUMNS = [("page", "string"), ("views", "long"), ("score", "double")]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tables.db'}"
    return request.getfixturevalue("postgres_database")


def writer(url: str, mode: str = "update", table: str = "totals", sink_id: str = "clicks.totals",
           columns=COLUMNS, key=("page",)) -> TableWriter:
    w = TableWriter(url, table, list(columns), list(key), mode, sink_id)
    w.ensure_table()
    return w


def test_update_mode_upserts_by_key(db_url):
    w = writer(db_url)
    assert w.write_batch(0, [("a", 1, 0.5), ("b", 2, 1.5)])
    assert w.write_batch(1, [("b", 20, 2.5), ("c", 3, None)])
    assert w.read_all() == [
        {"page": "a", "views": 1, "score": 0.5},
        {"page": "b", "views": 20, "score": 2.5},
        {"page": "c", "views": 3, "score": None},
    ]


def test_complete_mode_replaces_the_table(db_url):
    w = writer(db_url, mode="complete")
    assert w.write_batch(0, [("a", 1, 0.5), ("b", 2, 1.5)])
    assert w.write_batch(1, [("b", 5, 1.0), ("c", 3, 2.0)])
    assert [r["page"] for r in w.read_all()] == ["b", "c"]
    assert w.write_batch(2, [])  # an empty complete result empties the table
    assert w.read_all() == []


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_replayed_batch_changes_nothing(db_url, mode):
    w = writer(db_url, mode=mode)
    assert w.write_batch(0, [("a", 1, 0.5)]) is True
    assert w.write_batch(1, [("b", 2, 1.5)]) is True
    before = w.read_all()
    # Spark replays a batch after a crash; its rows may even differ (non-deterministic source).
    assert w.write_batch(1, [("b", 99, 9.9), ("z", 9, 9.9)]) is False
    assert w.write_batch(0, []) is False
    assert w.read_all() == before
    assert w.applied_batches() == [0, 1]
    # A new writer instance (a restarted job) sees the same ledger.
    assert writer(db_url, mode=mode).write_batch(1, [("q", 1, 1.0)]) is False
    assert w.read_all() == before


def test_ledger_records_batches_per_sink(db_url):
    first = writer(db_url, sink_id="clicks.totals")
    other = writer(db_url, table="other", sink_id="clicks.other")
    for batch in (0, 1, 2, 5):
        assert first.write_batch(batch, [(f"p{batch}", batch, 1.0)])
    assert other.write_batch(1, [("x", 1, 1.0)])  # the same batch id for another sink is independent
    assert first.applied_batches() == [0, 1, 2, 5]
    assert other.applied_batches() == [1]
    db = open_database(db_url)
    with db.connect() as conn:
        ledger = conn.execute("SELECT sink, batch_id, rows FROM _stream_batches ORDER BY sink, batch_id").fetchall()
    assert [tuple(r) for r in ledger] == [("clicks.other", 1, 1), ("clicks.totals", 0, 1), ("clicks.totals", 1, 1),
                                          ("clicks.totals", 2, 1), ("clicks.totals", 5, 1)]


def test_null_key_is_rejected_and_nothing_is_applied(db_url):
    w = writer(db_url, table="windows", columns=[("window_start", "timestamp"), ("device", "string"),
                                                 ("n", "long")], key=("window_start", "device"))
    t = datetime(2024, 1, 1)
    with pytest.raises(ValueError, match=r"'windows'.*row 1 has NULL in key column 'device'"):
        w.write_batch(0, [(t, "d1", 1), (t, None, 2)])
    assert w.read_all() == []
    assert w.applied_batches() == []
    assert w.write_batch(0, [(t, "d1", 1)])  # the batch id is still free


def test_bad_rows_are_rejected(db_url):
    w = writer(db_url)
    with pytest.raises(ValueError, match=r"'totals'.*column 'views' is long and needs an int, got str"):
        w.write_batch(0, [("a", "1", 0.5)])
    with pytest.raises(ValueError, match=r"row 0 has 2 values for 3 columns"):
        w.write_batch(0, [("a", 1)])
    with pytest.raises(ValueError, match=r"missing \['score'\], unexpected \['extra'\]"):
        w.write_batch(0, [{"page": "a", "views": 1, "extra": 2}])
    with pytest.raises(ValueError, match=r"rows 0 and 1 have the same key \{'page': 'a'\}"):
        w.write_batch(0, [("a", 1, 0.5), ("a", 2, 0.5)])
    assert w.applied_batches() == []


def test_rows_by_name(db_url):
    w = writer(db_url)
    Row = namedtuple("Row", ["score", "page", "views"])  # a different order than the columns: matched by name
    assert w.write_batch(0, [{"views": 1, "score": 2.0, "page": "a"}, Row(3.0, "b", 2)])
    assert w.read_all() == [{"page": "a", "views": 1, "score": 2.0}, {"page": "b", "views": 2, "score": 3.0}]


def test_existing_table_with_other_columns_is_an_error(db_url):
    writer(db_url).write_batch(0, [("a", 1, 0.5)])
    with pytest.raises(ValueError, match=r"table 'totals' .*exists with different columns: expected page .*"
                                         r"clicks .*; found page .*score"):
        writer(db_url, columns=[("page", "string"), ("clicks", "long")])
    with pytest.raises(ValueError, match=r"expected .*views .*; key \(page, views\); found .*key \(page\)"):
        writer(db_url, key=("page", "views"))
    with pytest.raises(ValueError, match=r"expected .*score \w+"):
        writer(db_url, columns=[("page", "string"), ("views", "long"), ("score", "string")])


def test_values_round_trip(db_url):
    cols = [("ts", "timestamp"), ("day", "date"), ("ok", "boolean"), ("n", "integer"), ("big", "long"),
            ("x", "double"), ("s", "string")]
    if db_url.startswith("postgresql"):  # a session time zone far from UTC must not shift values
        db_url += "?options=-c%20TimeZone%3DPacific/Chatham"
    w = writer(db_url, table="typed", columns=cols, key=("ts",))
    naive = datetime(2024, 3, 31, 23, 59, 58, 123456)  # naive = UTC
    aware = datetime(2024, 4, 1, 3, 0, 0, 1, tzinfo=timezone(timedelta(hours=2)))  # 01:00:00.000001 UTC
    assert w.write_batch(0, [
        (naive, date(2024, 3, 31), True, -(2**31), 2**62, 0.1, "ünïcode ' \" ;"),
        (aware, None, False, 7, None, 3, None),
    ])
    assert w.read_all() == [
        {"ts": naive, "day": date(2024, 3, 31), "ok": True, "n": -(2**31), "big": 2**62, "x": 0.1,
         "s": "ünïcode ' \" ;"},
        {"ts": datetime(2024, 4, 1, 1, 0, 0, 1), "day": None, "ok": False, "n": 7, "big": None, "x": 3.0,
         "s": None},
    ]
    # The same instant, naive UTC and aware, is the same key.
    assert w.write_batch(1, [(datetime(2024, 4, 1, 1, 0, 0, 1, tzinfo=UTC), None, True, 8, None, 1.0, "u")])
    assert [r["n"] for r in w.read_all()] == [-(2**31), 8]
    with pytest.raises(ValueError, match="within 32 bits"):
        w.write_batch(2, [(naive, None, None, 2**31, None, None, None)])


def test_racing_writers_apply_a_batch_once(db_url):
    writers = [writer(db_url) for _ in range(4)]
    for batch in range(3):
        barrier = threading.Barrier(len(writers))
        results: dict[int, bool | BaseException] = {}

        def attempt(i: int, w: TableWriter, batch: int = batch, barrier: threading.Barrier = barrier,
                    results: dict = results) -> None:
            barrier.wait()
            try:
                results[i] = w.write_batch(batch, [(f"b{batch}-w{i}-{n}", n, 1.0) for n in range(50)])
            except BaseException as exc:  # reported below
                results[i] = exc

        threads = [threading.Thread(target=attempt, args=(i, w)) for i, w in enumerate(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(results) == [0, 1, 2, 3], results
        assert sorted(results.values(), key=str) == [False, False, False, True], results
        winner = next(i for i, r in results.items() if r is True)
        pages = {r["page"] for r in writers[0].read_all() if r["page"].startswith(f"b{batch}-")}
        assert pages == {f"b{batch}-w{winner}-{n}" for n in range(50)}
    assert writers[0].applied_batches() == [0, 1, 2]


def test_large_batches(db_url):
    w = writer(db_url)
    n = 5000
    assert w.write_batch(0, [(f"p{i:05d}", i, i / 2) for i in range(n)])
    assert w.write_batch(1, [(f"p{i:05d}", i * 10, None) for i in range(0, n, 2)])
    rows = w.read_all()
    assert len(rows) == n
    assert rows[0] == {"page": "p00000", "views": 0, "score": None}
    assert rows[1] == {"page": "p00001", "views": 1, "score": 0.5}
    assert rows[-2] == {"page": "p04998", "views": 49980, "score": None}
    complete = writer(db_url, mode="complete", table="complete_totals", sink_id="clicks.complete")
    assert complete.write_batch(0, [(f"p{i}", i, 1.0) for i in range(n)])
    assert complete.write_batch(1, [(f"q{i}", i, 1.0) for i in range(n)])
    assert {r["page"][0] for r in complete.read_all()} == {"q"}


def test_writer_survives_pickling(db_url):
    w = writer(db_url)
    clone = pickle.loads(pickle.dumps(w))
    assert clone.write_batch(0, [("a", 1, 1.0)])
    assert w.applied_batches() == [0]


# ---- configuration (no database needed) -------------------------------------------------------


def test_every_spec_type_has_sql_types():
    for types in SQL_TYPES.values():
        assert set(types) == set(SPARK_TYPES)


def test_unknown_url_scheme():
    with pytest.raises(ValueError, match=r"unsupported database URL 'mysql://u:\*\*\*@h/db': use sqlite"):
        TableWriter("mysql://u:secret@h/db", "t", COLUMNS, ["page"], "update", "s")
    with pytest.raises(ValueError, match="must name an absolute path"):
        TableWriter("sqlite:///relative.db", "t", COLUMNS, ["page"], "update", "s")


def test_redact_hides_passwords():
    assert redact("postgresql://app:s3cr%40t@db:5432/streams") == "postgresql://app:***@db:5432/streams"
    assert redact("postgresql://app@/streams?host=/run/pg&password=x") == \
        "postgresql://app@/streams?host=/run/pg&password=***"
    assert redact("sqlite:////data/t.db") == "sqlite:////data/t.db"
    assert redact("host=db password='a b' user=app") == "host=db password=*** user=app"
    w = TableWriter("postgresql://app:s3cret@db/streams", "t", COLUMNS, ["page"], "update", "s")
    assert "s3cret" not in repr(w)


@pytest.mark.parametrize("table, columns, key, message", [
    ("Bad", COLUMNS, ["page"], "not a safe table name"),
    ("t; drop", COLUMNS, ["page"], "not a safe table name"),
    ("t", [("pa ge", "string")], ["pa ge"], "not a plain column name"),
    ("t", [('p"', "string")], ['p"'], "not a plain column name"),
    ("t", [("page", "varchar")], ["page"], "unknown type 'varchar'"),
    ("t", [("page", "string"), ("Page", "long")], ["page"], "duplicate column 'Page'"),
    ("t", COLUMNS, [], "needs a key"),
    ("t", COLUMNS, ["nope"], "key column 'nope' is not one of the columns"),
    ("t", [("x" * 64, "string")], ["x" * 64], "longer than PostgreSQL's 63"),
])
def test_identifiers_are_validated(table, columns, key, message):
    with pytest.raises(ValueError, match=message):
        TableWriter("postgresql://u@h/db", table, columns, key, "update", "s")
