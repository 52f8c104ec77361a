"""The relational table sink's database layer: idempotent writes, one micro-batch at a time.

A :class:`TableSchema` is a table's declared shape (validated names, types, key) and the
SQL made from it; a :class:`TableWriter` applies batches through it, converting and
checking the rows' values.

Spark's ``foreachBatch`` hands every micro-batch to :meth:`TableWriter.write_batch`.
After a crash Spark replays the last batch with the same batch id, so each batch is
applied in one transaction that also records ``(sink, batch_id)`` in the ledger table
``_stream_batches``. The ledger row is inserted first: if it is already there (the batch
was applied, or a racing attempt holds it), nothing is changed and ``False`` is returned.

Supported databases: SQLite (``sqlite:////abs/path.db``, stdlib ``sqlite3``, WAL) and
PostgreSQL (``postgresql://user:pass@host:port/db`` or ``postgresql://user@/db?host=/dir``,
psycopg 3). Timestamps are UTC: naive datetimes are taken as UTC, aware ones are
converted, and :meth:`TableWriter.read_all` returns naive UTC datetimes.

This module must not import pyspark. A writer holds no connection (one is opened per
call), so it can be pickled into a Spark Connect ``foreachBatch`` function.
"""

from __future__ import annotations

import logging
import operator
import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from spark_jobs.stream_spec.layout import redact
from spark_jobs.stream_spec.models import (
    NAME_PATTERN,
    SPARK_TYPES,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from spark_jobs.plan import OutputPlan

log = logging.getLogger(__name__)

COLUMN_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LEDGER_TABLE = "_stream_batches"
SQLITE_BUSY_TIMEOUT_SECONDS = 60.0
PG_CONNECT_TIMEOUT_SECONDS = 15
PG_MAX_IDENTIFIER = 63

Mode = Literal["append", "update", "complete"]

#: Spec type -> (DDL type, type name the database reports for an existing column).
SQL_TYPES: dict[str, dict[str, tuple[str, str]]] = {
    "sqlite": {
        "string": ("TEXT", "TEXT"),
        "integer": ("INTEGER", "INTEGER"),
        "long": ("INTEGER", "INTEGER"),
        "double": ("REAL", "REAL"),
        "boolean": ("BOOLEAN", "BOOLEAN"),  # stored as 0/1
        "timestamp": ("TIMESTAMP", "TIMESTAMP"),  # ISO text 'YYYY-MM-DD HH:MM:SS.ffffff', UTC
        "date": ("DATE", "DATE"),  # ISO text 'YYYY-MM-DD'
    },
    "postgresql": {
        "string": ("TEXT", "text"),
        "integer": ("INTEGER", "integer"),
        "long": ("BIGINT", "bigint"),
        "double": ("DOUBLE PRECISION", "double precision"),
        "boolean": ("BOOLEAN", "boolean"),
        "timestamp": ("TIMESTAMPTZ", "timestamp with time zone"),
        "date": ("DATE", "date"),
    },
}
assert all(set(types) == set(SPARK_TYPES) for types in SQL_TYPES.values())


class TableSinkError(ValueError):
    """Bad configuration or data for a table sink; the message names the table."""


def _quote(name: str) -> str:
    return '"' + name + '"'  # names are validated: no quotes inside


def _utc_naive(value: datetime) -> datetime:
    return value if value.tzinfo is None else value.astimezone(UTC).replace(tzinfo=None)


# ---- databases --------------------------------------------------------------------------


class _Database:
    dialect: str
    placeholder: str

    def connect(self) -> Any: ...  # a context manager yielding a connection

    def run_ddl(self, conn: Any, statements: list[str]) -> None: ...

    def describe(self, conn: Any, table: str) -> tuple[list[tuple[str, str]], list[str]] | None: ...

    def apply(self, conn: Any, ledger: tuple[str, tuple[Any, ...]], delete: str | None,
              upsert: str, rows: list[tuple[Any, ...]]) -> bool: ...

    def dump(self, spec_type: str) -> Callable[[Any], Any] | None:
        """Extra conversion of an already validated value for this database."""
        return None

    def load(self, spec_type: str) -> Callable[[Any], Any] | None:
        return None

    def now(self) -> Any:
        return datetime.now(UTC).replace(tzinfo=None)

    def swap_tables(self, live: str, staged: str, before: str) -> None:
        """The ``staged`` table takes ``live``'s name and ``live`` takes ``before``'s, in one
        transaction (an upgrade's swap): a reader sees the old table or the new one. Done already
        (no staged table left): nothing."""
        with self.connect() as conn:
            if self.describe(conn, staged) is None:
                return
            renames = [f"ALTER TABLE {_quote(live)} RENAME TO {_quote(before)}"] if self.describe(conn, live) else []
            self.run_ddl(conn, [*renames, f"ALTER TABLE {_quote(staged)} RENAME TO {_quote(live)}"])

    def restore_table(self, live: str, before: str, staged: str) -> None:
        """Undo :meth:`swap_tables` (or an unfinished one), in one transaction: ``before`` is ``live``
        again, and the other table goes."""
        with self.connect() as conn:
            statements = [f"DROP TABLE IF EXISTS {_quote(staged)}"]
            if self.describe(conn, before) is not None:
                statements += [f"DROP TABLE IF EXISTS {_quote(live)}",
                               f"ALTER TABLE {_quote(before)} RENAME TO {_quote(live)}"]
            self.run_ddl(conn, statements)

    def rows_in(self, table: str) -> int | None:
        """How many rows ``table`` holds; None if there is no such table."""
        with self.connect() as conn:
            if self.describe(conn, table) is None:
                return None
            return int(conn.execute(f"SELECT COUNT(*) FROM {_quote(table)}").fetchone()[0])

    def rename_table(self, table: str, to: str) -> bool:
        """Rename ``table`` to ``to`` if it exists and ``to`` does not; whether it did."""
        with self.connect() as conn:
            if self.describe(conn, table) is None or self.describe(conn, to) is not None:
                return False
            self.run_ddl(conn, [f"ALTER TABLE {_quote(table)} RENAME TO {_quote(to)}"])
            return True

    def drop_table(self, table: str) -> bool:
        """Drop ``table`` if it exists (an upgrade's old table, cleaned up); whether it did."""
        with self.connect() as conn:
            if self.describe(conn, table) is None:
                return False
            self.run_ddl(conn, [f"DROP TABLE {_quote(table)}"])
            return True


class _SQLite(_Database):
    dialect = "sqlite"
    placeholder = "?"

    def __init__(self, path: str):
        self.path = path

    def rows_in(self, table: str) -> int | None:
        return super().rows_in(table) if Path(self.path).exists() else None  # (a check makes no database)

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=SQLITE_BUSY_TIMEOUT_SECONDS, isolation_level=None)
        with closing(conn):
            conn.execute("PRAGMA journal_mode=WAL")
            yield conn

    @contextmanager
    def _transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        conn.execute("BEGIN IMMEDIATE")  # take the write lock now: racing writers queue here
        try:
            yield
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def run_ddl(self, conn: sqlite3.Connection, statements: list[str]) -> None:
        with self._transaction(conn):
            for statement in statements:
                conn.execute(statement)

    def describe(self, conn: sqlite3.Connection, table: str) -> tuple[list[tuple[str, str]], list[str]] | None:
        info = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
        if not info:
            return None
        columns = [(name, str(type_).upper()) for _, name, type_, _, _, _ in info]
        key = [row[1] for row in sorted(info, key=lambda r: r[5]) if row[5]]  # pk: position in the key, 0 if none
        return columns, key

    def apply(self, conn: sqlite3.Connection, ledger: tuple[str, tuple[Any, ...]], delete: str | None,
              upsert: str, rows: list[tuple[Any, ...]]) -> bool:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute(*ledger).rowcount == 0:
                conn.execute("ROLLBACK")
                return False
            if delete:
                conn.execute(delete)
            conn.executemany(upsert, rows)
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return True

    def dump(self, spec_type: str) -> Callable[[Any], Any] | None:
        if spec_type == "timestamp":
            return lambda v: v.isoformat(sep=" ", timespec="microseconds")  # fixed width: sorts correctly
        if spec_type == "date":
            return date.isoformat
        if spec_type == "boolean":
            return int
        return None

    def load(self, spec_type: str) -> Callable[[Any], Any] | None:
        return {"timestamp": datetime.fromisoformat, "date": date.fromisoformat, "boolean": bool,
                "double": float}.get(spec_type)

    def now(self) -> Any:
        return datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


class _Postgres(_Database):
    dialect = "postgresql"
    placeholder = "%s"

    def __init__(self, url: str):
        import psycopg  # noqa: F401 - fail early if missing

        self.url = url

    @contextmanager
    def connect(self) -> Iterator[Any]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        extra = {} if "connect_timeout" in conninfo_to_dict(self.url) else {"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS}
        with psycopg.connect(self.url, autocommit=True, **extra) as conn:
            yield conn

    def run_ddl(self, conn: Any, statements: list[str]) -> None:
        with conn.transaction():
            # CREATE TABLE IF NOT EXISTS is not safe against a concurrent CREATE: serialize.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('spark_jobs.sinks.table ddl'))")
            for statement in statements:
                conn.execute(statement)

    def describe(self, conn: Any, table: str) -> tuple[list[tuple[str, str]], list[str]] | None:
        regclass = conn.execute("SELECT to_regclass(%s)::oid", (_quote(table),)).fetchone()[0]
        if regclass is None:
            return None
        columns = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (regclass,),
        ).fetchall()
        key = conn.execute(
            "SELECT a.attname FROM pg_index i"
            " CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
            " WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
            (regclass,),
        ).fetchall()
        return [(name, type_) for name, type_ in columns], [name for (name,) in key]

    def apply(self, conn: Any, ledger: tuple[str, tuple[Any, ...]], delete: str | None,
              upsert: str, rows: list[tuple[Any, ...]]) -> bool:
        import psycopg

        applied = False
        with conn.transaction():
            # A racing attempt that inserted the same ledger row first makes this insert
            # wait for its commit; then ON CONFLICT DO NOTHING inserts nothing.
            if conn.execute(*ledger).rowcount == 0:
                raise psycopg.Rollback()
            if delete:
                conn.execute(delete)
            if rows:
                with conn.cursor() as cur:
                    cur.executemany(upsert, rows)
            applied = True
        return applied

    def dump(self, spec_type: str) -> Callable[[Any], Any] | None:
        if spec_type == "timestamp":
            return lambda v: v.replace(tzinfo=UTC)  # an aware value: independent of the session time zone
        return None

    def load(self, spec_type: str) -> Callable[[Any], Any] | None:
        if spec_type == "timestamp":
            return _utc_naive
        return None


def open_database(url: str) -> _Database:
    """The database for a sink URL; raises :class:`TableSinkError` for unsupported URLs."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        path = path.split("?", 1)[0]
        if not path.startswith("/"):
            raise TableSinkError(
                f"SQLite URL {redact(url)!r} must name an absolute path: sqlite:////abs/path.db"
                " (relative paths are resolved by Layout.table_url)")
        return _SQLite(path)
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return _Postgres("postgresql://" + url.split("://", 1)[1])
    raise TableSinkError(
        f"unsupported database URL {redact(url)!r}: use sqlite:////abs/path.db or"
        " postgresql://user:password@host:port/database")


# ---- the definition ---------------------------------------------------------------------


class TableSchema:
    """A table's declared shape in one SQL dialect: validated names, types and key, and the SQL made from them.

    ``columns`` are ``(name, spec type)`` pairs in row order; ``key`` is the primary key.
    The statements cover the table and the ledger ``_stream_batches`` beside it; names are
    validated here, so they can be quoted into SQL.
    """

    def __init__(self, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str], dialect: str,
                 placeholder: str):
        self.table = table
        self.columns = [(str(n), str(t)) for n, t in columns]
        self.key = list(key)
        self.dialect = dialect
        self.placeholder = placeholder
        self._validate()
        self.names = [n for n, _ in self.columns]
        self.key_index = [self.names.index(k) for k in self.key]

    def _validate(self) -> None:
        t = self.table
        if not isinstance(t, str) or not NAME_PATTERN.match(t):
            raise TableSinkError(f"{t!r} is not a safe table name (lower case letters, digits, '_')")
        if not self.columns:
            raise TableSinkError(f"table {t!r}: no columns")
        seen: set[str] = set()
        for name, type_ in self.columns:
            if not COLUMN_PATTERN.match(name):
                raise TableSinkError(f"table {t!r}: {name!r} is not a plain column name (letters, digits, '_')")
            if self.dialect == "postgresql" and len(name) > PG_MAX_IDENTIFIER:
                raise TableSinkError(f"table {t!r}: column {name!r} is longer than PostgreSQL's"
                                     f" {PG_MAX_IDENTIFIER} characters")
            if name.lower() in seen:
                raise TableSinkError(f"table {t!r}: duplicate column {name!r} (names are compared ignoring case)")
            seen.add(name.lower())
            if type_ not in SPARK_TYPES:
                raise TableSinkError(f"table {t!r}: column {name!r} has unknown type {type_!r};"
                                     f" use one of {sorted(SPARK_TYPES)}")
        names = [n for n, _ in self.columns]
        if not self.key:
            raise TableSinkError(f"table {t!r}: a table sink needs a key")
        for k in self.key:
            if k not in names:
                raise TableSinkError(f"table {t!r}: key column {k!r} is not one of the columns {names}")
        if len(set(self.key)) != len(self.key):
            raise TableSinkError(f"table {t!r}: duplicate key columns {self.key}")

    def create_statements(self) -> list[str]:
        """Create the ledger and the table if missing."""
        types = SQL_TYPES[self.dialect]
        cols = [f"{_quote(n)} {types[t][0]}{' NOT NULL' if n in self.key else ''}" for n, t in self.columns]
        pk = ", ".join(_quote(k) for k in self.key)
        table = f"CREATE TABLE IF NOT EXISTS {_quote(self.table)} ({', '.join(cols)}, PRIMARY KEY ({pk}))"
        ledger = (f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (sink TEXT NOT NULL, batch_id BIGINT NOT NULL,"
                  " rows BIGINT NOT NULL, applied_at TIMESTAMP NOT NULL, PRIMARY KEY (sink, batch_id))")
        return [ledger, table]

    def check_existing(self, found_columns: list[tuple[str, str]], found_key: list[str], where: str) -> None:
        """Raise unless a table found ``where`` (a redacted URL) has the declared columns and key, in any order."""
        types = SQL_TYPES[self.dialect]
        expected = [(n, types[t][1]) for n, t in self.columns]
        if sorted(found_columns) != sorted(expected) or sorted(found_key) != sorted(self.key):
            def show(cols: list[tuple[str, str]], key: list[str]) -> str:
                return ", ".join(f"{n} {t}" for n, t in cols) + f"; key ({', '.join(key)})"

            raise TableSinkError(
                f"table {self.table!r} in {where} exists with different columns:"
                f" expected {show(expected, self.key)}; found {show(found_columns, found_key)}."
                " Migrate or drop the table (or write to a new table); it is not altered automatically.")

    def upsert_sql(self) -> str:
        """Insert a row, or update the row with its key."""
        p = self.placeholder
        cols = ", ".join(_quote(n) for n in self.names)
        values = ", ".join([p] * len(self.names))
        key = ", ".join(_quote(k) for k in self.key)
        others = [n for n in self.names if n not in self.key]
        action = ("DO UPDATE SET " + ", ".join(f"{_quote(n)} = excluded.{_quote(n)}" for n in others)
                  if others else "DO NOTHING")
        return f"INSERT INTO {_quote(self.table)} ({cols}) VALUES ({values}) ON CONFLICT ({key}) {action}"

    def delete_sql(self) -> str:
        """Empty the table (complete mode replaces its contents)."""
        return f"DELETE FROM {_quote(self.table)}"

    def select_sql(self) -> str:
        """Every row, in column order, ordered by key."""
        cols = ", ".join(_quote(n) for n in self.names)
        order = ", ".join(_quote(k) for k in self.key)
        return f"SELECT {cols} FROM {_quote(self.table)} ORDER BY {order}"

    def ledger_sql(self) -> str:
        """Record ``(sink, batch_id, rows, applied_at)``; inserts nothing if the batch is recorded already."""
        p = self.placeholder
        return (f"INSERT INTO {LEDGER_TABLE} (sink, batch_id, rows, applied_at) VALUES ({p}, {p}, {p}, {p})"
                " ON CONFLICT (sink, batch_id) DO NOTHING")

    def applied_sql(self) -> str:
        """The batch ids recorded for one sink, ascending."""
        return f"SELECT batch_id FROM {LEDGER_TABLE} WHERE sink = {self.placeholder} ORDER BY batch_id"


# ---- the writer -------------------------------------------------------------------------


def _checker(table: str, column: str, spec_type: str) -> Callable[[Any], Any]:
    """Validates a non-null Python value for a column and normalizes it."""

    def bad(value: Any, what: str) -> TableSinkError:
        return TableSinkError(f"table {table!r}: column {column!r} is {spec_type} and needs {what},"
                              f" got {type(value).__name__} {value!r:.80}")

    def integer(bits: int) -> Callable[[Any], Any]:
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

        def check(v: Any) -> int:
            if isinstance(v, bool):
                raise bad(v, "an int")
            try:
                v2 = operator.index(v)  # int and numpy integers
            except TypeError:
                raise bad(v, "an int") from None
            if not low <= v2 <= high:
                raise bad(v, f"an int within {bits} bits")
            return v2

        return check

    def double(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float | Decimal):
            raise bad(v, "a number")
        return float(v)

    def string(v: Any) -> str:
        if not isinstance(v, str):
            raise bad(v, "a str")
        return v

    def boolean(v: Any) -> bool:
        if not isinstance(v, bool):
            raise bad(v, "a bool")
        return v

    def timestamp(v: Any) -> datetime:
        if not isinstance(v, datetime):
            raise bad(v, "a datetime")
        return _utc_naive(v)

    def date_(v: Any) -> date:
        if isinstance(v, datetime) or not isinstance(v, date):
            raise bad(v, "a date (not a datetime)")
        return v

    checks = {"string": string, "integer": integer(32), "long": integer(64), "double": double,
              "boolean": boolean, "timestamp": timestamp, "date": date_}
    return checks[spec_type]


class TableWriter:
    """Writes micro-batches of one query's result rows into one table, idempotently.

    ``columns`` are ``(name, spec type)`` pairs in row order; ``key`` is the primary key
    (see :class:`TableSchema`).
    ``mode`` ``"update"`` (and ``"append"``, which is the same here) upserts the batch's
    rows by key; ``"complete"`` replaces the table's contents with the batch.
    ``sink_id`` names the writer in the ledger: it must be unique per query *and*
    checkpoint, since batch ids start again at 0 when a checkpoint is reset.
    """

    def __init__(self, url: str, table: str, columns: Sequence[tuple[str, str]], key: Sequence[str],
                 mode: Mode, sink_id: str):
        self.table = table
        self.mode = mode
        self.sink_id = sink_id
        self._url = url
        self._db = open_database(url)
        self.schema = TableSchema(table, columns, key, self._db.dialect, self._db.placeholder)
        if mode not in ("append", "update", "complete"):
            raise TableSinkError(f"table {table!r}: mode must be update or complete, not {mode!r}")
        if not isinstance(sink_id, str) or not sink_id.strip():
            raise TableSinkError(f"table {table!r}: sink_id must be a non-empty string")
        self._set_conversions()
        self._ensured = False

    @property
    def columns(self) -> list[tuple[str, str]]:
        return self.schema.columns

    @property
    def key(self) -> list[str]:
        return self.schema.key

    def __repr__(self) -> str:
        return (f"TableWriter(table={self.table!r}, url={redact(self._url)!r}, mode={self.mode!r},"
                f" sink_id={self.sink_id!r})")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_checks", "_dumps", "_loads")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._set_conversions()

    def _set_conversions(self) -> None:
        """Per column: the value check, the conversion for the database and back (closures: not pickled)."""
        self._checks = [_checker(self.table, n, t) for n, t in self.columns]
        self._dumps = [self._db.dump(t) for _, t in self.columns]
        self._loads = [self._db.load(t) for _, t in self.columns]

    # ---- API ----------------------------------------------------------------------------

    def ensure_table(self) -> None:
        """Create the table and the ledger if missing; check an existing table's shape."""
        with self._db.connect() as conn:
            self._db.run_ddl(conn, self.schema.create_statements())
            found = self._db.describe(conn, self.table)
        assert found is not None
        self.schema.check_existing(*found, where=redact(self._url))
        self._ensured = True

    def write_batch(self, batch_id: int, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> bool:
        """Apply one micro-batch in one transaction; ``False`` if it was applied before."""
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise TableSinkError(f"table {self.table!r}: batch id must be a non-negative int, not {batch_id!r}")
        params = self._prepare(rows)
        if not self._ensured:
            self.ensure_table()
        delete = self.schema.delete_sql() if self.mode == "complete" else None
        ledger = (self.schema.ledger_sql(), (self.sink_id, batch_id, len(params), self._db.now()))
        with self._db.connect() as conn:
            return self._db.apply(conn, ledger, delete, self.schema.upsert_sql(), params)

    def applied_batches(self) -> list[int]:
        """Batch ids this sink has applied, ascending."""
        if not self._ensured:
            self.ensure_table()
        with self._db.connect() as conn:
            rows = conn.execute(self.schema.applied_sql(), (self.sink_id,)).fetchall()
        return [int(r[0]) for r in rows]

    def read_all(self) -> list[dict[str, Any]]:
        """Every row of the table as a dict, ordered by key (timestamps naive UTC)."""
        if not self._ensured:
            self.ensure_table()
        with self._db.connect() as conn:
            rows = conn.execute(self.schema.select_sql()).fetchall()
        loads = list(zip(self.schema.names, self._loads, strict=True))
        return [{n: (v if v is None or f is None else f(v)) for (n, f), v in zip(loads, row, strict=True)}
                for row in rows]

    # ---- rows ---------------------------------------------------------------------------

    def _values(self, index: int, row: Any) -> Sequence[Any]:
        names = self.schema.names
        if not isinstance(row, Mapping):
            fields = getattr(row, "__fields__", None) or getattr(row, "_fields", None)
            if fields and isinstance(row, tuple):  # a Spark Row or a namedtuple: match by name
                row = dict(zip(fields, row, strict=True))
        if isinstance(row, Mapping):
            missing = [n for n in names if n not in row]
            extra = [n for n in row if n not in names]
            if missing or extra:
                raise TableSinkError(f"table {self.table!r}: row {index} does not match the columns {names}:"
                                     f" missing {missing}, unexpected {extra}")
            return [row[n] for n in names]
        if isinstance(row, str | bytes) or not isinstance(row, Sequence):
            raise TableSinkError(f"table {self.table!r}: row {index} is a {type(row).__name__};"
                                 " rows must be sequences in column order or mappings by column name")
        if len(row) != len(names):
            raise TableSinkError(f"table {self.table!r}: row {index} has {len(row)} values for"
                                 f" {len(names)} columns {names}")
        return row

    def _prepare(self, rows: Iterable[Sequence[Any] | Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        """Validate and convert every row before any database work (no lock held meanwhile)."""
        out: list[tuple[Any, ...]] = []
        keys: dict[tuple[Any, ...], int] = {}
        checks = list(zip(self._checks, self._dumps, strict=True))
        for index, row in enumerate(rows):
            values = self._values(index, row)
            for k in self.schema.key_index:
                if values[k] is None:
                    raise TableSinkError(f"table {self.table!r}: row {index} has NULL in key column"
                                         f" {self.schema.names[k]!r}; rows with a null key are not written")
            converted = []
            for (check, dump), v in zip(checks, values, strict=True):
                if v is not None:
                    v = check(v)
                    if dump is not None:
                        v = dump(v)
                converted.append(v)
            key = tuple(converted[k] for k in self.schema.key_index)
            if key in keys:
                raise TableSinkError(
                    f"table {self.table!r}: rows {keys[key]} and {index} have the same key"
                    f" {dict(zip(self.key, key, strict=True))}; the key {self.key} does not identify a result row")
            keys[key] = index
            out.append(tuple(converted))
        # A fixed order takes row locks in the same order in every writer (no deadlocks).
        out.sort(key=lambda r: tuple(r[k] for k in self.schema.key_index))
        return out


# ---- the sink of a streaming output (foreachBatch) --------------------------------------------


#: The Spark types a table stores, by their names (which are the spec's type names)
_STORABLE = ("string", "integer", "long", "double", "boolean", "timestamp", "date")


def spec_type(data_type: Any) -> str:  # a pyspark DataType
    """The spec's name of a Spark type a table stores; ValueError for any other."""
    if data_type.typeName() in _STORABLE:
        return data_type.typeName()
    raise ValueError(f"cannot store {data_type.simpleString()} in a table")


def table_writer(columns: list[tuple[str, str]], output: OutputPlan, sink_id: str) -> TableWriter:
    sink = output.sink
    assert sink.kind == "table"
    return TableWriter(url=sink.url, table=sink.table, columns=columns, key=output.key, mode=output.mode,
                       sink_id=sink_id)


def table_sink_id(stream: str, output: str, checkpoint_query_id: str | None) -> str:
    """Batch ids start again at 0 in a new checkpoint, so the ledger names the sink by its
    output and the checkpoint's query id: a reset checkpoint never skips real batches."""
    return f"{stream}.{output}@{checkpoint_query_id}"


def foreach_table_batch(frame: DataFrame, stream: str, output: OutputPlan) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function of a table sink; its writer is made at the first batch,
    when the checkpoint (and so its query id) exists."""
    columns = [(f.name, spec_type(f.dataType)) for f in frame.schema.fields]
    table_writer(columns, output, "unstarted").ensure_table()
    from spark_jobs.runtime.checkpoint import query_id
    from spark_jobs.runtime.lease import fence

    writers: list[Any] = []

    def write(batch: DataFrame, batch_id: int) -> None:
        if not writers:
            writers.append(table_writer(columns, output, table_sink_id(stream, output.name,
                                                                       query_id(output.checkpoint))))
        writer = writers[0]
        names = [c for c, _ in columns]
        rows = [tuple(r[n] for n in names) for r in batch.select(*names).collect()]  # one job, every task at once
        fence()  # only while this driver holds the stream (spark_jobs.runtime.lease)
        applied = writer.write_batch(batch_id, rows)
        log.info("table %s batch %d: %s %d rows", writer.table, batch_id,
                 "applied" if applied else "already applied, skipped", len(rows))

    return write
