"""The watcher's durable record: one SQLite database (WAL) per cluster.

Tables: ``events`` (what happened, deduplicated), ``progress`` (trainer heartbeats), ``ticks``
(every observation handed to the policy, so a restarted watcher can rebuild the policy's
history), ``decisions`` (what the watcher chose to do), ``applies`` (each attempt at doing it),
``nodes`` (which instance ran when, on which market, and how it ended: the basis of cost
accounting; one row per incarnation, since a stopped GCP spot VM comes back under the same id),
``nodes`` also keeps each incarnation's shape and
price per hour (where the job ran on several shapes or zones, the cost is theirs), ``applies`` the
offer (zone x shape x market) each apply was for; ``run`` (one row: the job's own facts, typed: when it started, the deployed market, the final
digest, whether it finished, the local clock, the spot backoff, the wall time so far)
and ``capacity_failures`` (per market). The schema version is SQLite's ``user_version``.

Exactly-once acting. A decision is committed as ``pending`` *before* anything is applied; an
apply attempt is committed as ``started`` before the backend is called, ``applied`` (with the
new nodes, and the node table and market updated: the cloud runs them now) as soon as the
backend returns, and ``ok`` together with the decision's ``done`` in one transaction after
bootstrap. A watcher killed anywhere in between finds, on restart, a
``started`` attempt (it asks the backend whether the apply had converged: adopt it, else retry),
or an ``applied`` one (bootstrap again, which is idempotent, and finish), or a ``pending``
decision with no attempt (apply it). No path applies the same decision twice after it converged.

One watcher per cluster: ``WatcherLock`` holds an exclusive ``fcntl`` lock on a file beside the
database for the watcher's lifetime; the kernel drops it when the process dies, even by SIGKILL.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import KitError
from kit.watch.events import PROGRESS, Event

SCHEMA_VERSION = 8
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, recorded REAL NOT NULL, kind TEXT NOT NULL,
    instance TEXT NOT NULL, node_rank INTEGER, source TEXT NOT NULL, detail TEXT NOT NULL,
    dedup_key TEXT UNIQUE);
CREATE TABLE IF NOT EXISTS progress (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, recorded REAL NOT NULL, instance TEXT NOT NULL,
    node_rank INTEGER, step INTEGER NOT NULL, total_steps INTEGER NOT NULL, step_time_s REAL,
    state TEXT, written REAL, checkpoint_step INTEGER, checkpoint_bytes INTEGER);
CREATE TABLE IF NOT EXISTS ticks (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, observation TEXT NOT NULL, decision TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY, created REAL NOT NULL, policy TEXT NOT NULL, decision TEXT NOT NULL,
    action TEXT NOT NULL CHECK (action IN ('launch', 'switch', 'recover', 'release', 'move')),
    market_before TEXT, market_after TEXT, reason TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'done', 'superseded', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0, next_attempt REAL NOT NULL DEFAULT 0, finished REAL,
    error TEXT, bootstrap_failures INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS applies (
    id INTEGER PRIMARY KEY, decision_id INTEGER NOT NULL REFERENCES decisions(id),
    started REAL NOT NULL, finished REAL, market TEXT,
    status TEXT NOT NULL CHECK (status IN ('started', 'applied', 'ok', 'failed', 'capacity', 'interrupted')),
    adopted INTEGER NOT NULL DEFAULT 0, error TEXT, nodes TEXT);
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, id);
CREATE INDEX IF NOT EXISTS progress_time ON progress(id);
CREATE INDEX IF NOT EXISTS decisions_status ON decisions(status);
CREATE TABLE IF NOT EXISTS run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    job_started REAL,                       -- the first watcher's start (fixed once written)
    market TEXT,                            -- the deployed cluster's market (NULL: none deployed)
    params_sha256 TEXT,                     -- the trainer's final digest (its "done" report)
    finished INTEGER NOT NULL DEFAULT 0,    -- kit train finished this job (exported, torn down)
    observed_event_id INTEGER NOT NULL DEFAULT 0,  -- the newest event a policy tick covered
    clock_origin REAL,                      -- the local backend's compressed clock starts here
    clock_scale REAL,                       -- and runs this many seconds per wall second
    clock_offset REAL,                      -- plus this (its scale changed in a continued run)
    spot_blocked_until REAL NOT NULL DEFAULT 0,    -- spot launches back off until then
    wall_seconds_done REAL NOT NULL DEFAULT 0);    -- kit train's wall time in earlier sessions
INSERT OR IGNORE INTO run(id) VALUES (1);
CREATE TABLE IF NOT EXISTS capacity_failures (market TEXT PRIMARY KEY, failures INTEGER NOT NULL);
"""
NODES_SCHEMA = """
-- One row per incarnation of an instance: a GCP spot VM stopped by a preemption (termination
-- action STOP) is restarted by the next apply under the same instance id, as a new row.
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY, instance_id TEXT NOT NULL, name TEXT NOT NULL, rank INTEGER NOT NULL,
    market TEXT, zone TEXT, private_ip TEXT, public_ip TEXT, disk_id TEXT,
    state TEXT NOT NULL CHECK (state IN ('up', 'lost', 'replaced', 'released')),
    since REAL NOT NULL, until REAL, apply_id INTEGER,
    lost_kind TEXT,  -- how this incarnation was lost ('preemption' / 'instance-lost' / 'stopped-by-kit'), NULL if it was not
    shape TEXT,      -- the shape it belonged to (kit.policy.offers.Shape.name), NULL before version 4
    price REAL);     -- $/h of this node on its market, NULL before version 4 (the spec's prices apply)
CREATE UNIQUE INDEX IF NOT EXISTS nodes_current ON nodes(instance_id) WHERE state IN ('up', 'lost');
"""
NODE_COLUMNS = "instance_id, name, rank, market, zone, private_ip, public_ip, disk_id, state, since, until, apply_id"
# Columns versions 4 to 7 added to tables that older ledgers already have (ALTER TABLE ... ADD COLUMN).
ADDED_COLUMNS = (("nodes", "shape", "TEXT"), ("nodes", "price", "REAL"), ("applies", "offer", "TEXT"),
                 ("progress", "written", "REAL"), ("progress", "checkpoint_step", "INTEGER"),
                 ("progress", "checkpoint_bytes", "INTEGER"), ("run", "clock_scale", "REAL"),
                 ("run", "clock_offset", "REAL"))
# Heartbeats in the order the trainer wrote them. Every node writes its own progress file, each at its
# own moment, and agents and the puller relay them late and in any order; a row without the write time
# (an older agent's) counts as written when it was recorded.
WRITTEN = "COALESCE(written, recorded)"
# A recorded observation's mark, set by the watcher on a tick whose losses interrupted the job: the step the job
# had reached then (kit.watch.watcher.Watcher._market_losses).
INTERRUPTED_AT = "interrupted_at_step"
# the step an interruption's tick recorded, read in SQL from the ticks' observations
_INTERRUPTED_STEP = f"json_extract(observation, '$.{INTERRUPTED_AT}')"


def _checkpoint_step(event: Event) -> int | None:
    """A progress report's ``checkpoint_step`` (free-form detail from the network): kept only when a step."""
    value = event.detail.get("checkpoint_step")
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= (event.total_steps or 0)
    return value if ok else None


def _checkpoint_bytes(event: Event) -> int | None:
    """A progress report's ``checkpoint_bytes`` (free-form detail from the network): kept only when a size."""
    value = event.detail.get("checkpoint_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else None


def _job_path(rows: list[sqlite3.Row], starts: list[float]) -> list[tuple[float, int]]:
    """(time, the job's step) at each progress report (``rows``, in the order written, ``w``): the highest step
    so far, or a lower one that is a setback. Every node writes its own report at its own moment, on its own
    clock, so node 1's report of step N can be written just after node 0's of N + 1: a crossing, no step lost.
    A lower step is a setback (the trainers resumed from an older checkpoint) when its reporter had reported a
    higher one with no node come up in between (that trainer went back), or when a node came up (``starts``, on
    the trainers' clock) after the highest step was written: a relaunch resumes from a checkpoint."""
    path: list[tuple[float, int]] = []
    top, top_starts = -1, 0
    last: dict[tuple[str, int | None], tuple[int, int]] = {}  # reporter -> (nodes started, step) of its newest
    for row in rows:
        started = bisect.bisect_right(starts, row["w"])  # node incarnations up by the time it was written
        reporter = (row["instance"], row["node_rank"])
        its_starts, its_step = last.get(reporter, (started, -1))
        went_back = its_starts == started and row["step"] < its_step
        if row["step"] >= top or went_back or started > top_starts:
            top, top_starts = row["step"], started
        last[reporter] = (started, row["step"])
        path.append((row["time"], top))
    return path


@dataclass(frozen=True)
class Decision:
    id: int
    created: float
    policy: str
    decision: str
    action: str
    market_before: str | None
    market_after: str | None
    reason: str
    status: str
    attempts: int
    next_attempt: float
    error: str | None
    finished: float | None = None
    bootstrap_failures: int = 0


@dataclass(frozen=True)
class Apply:
    id: int
    decision_id: int
    started: float
    finished: float | None
    market: str | None
    status: str
    adopted: bool
    error: str | None
    nodes: list[dict] | None
    offer: str | None = None  # kit.policy.offers.Offer.name of what was applied (None: a release, or older)


@dataclass(frozen=True)
class NodeRow:
    instance_id: str
    name: str
    rank: int
    market: str | None
    zone: str | None
    private_ip: str | None
    public_ip: str | None
    disk_id: str | None
    state: str
    since: float
    until: float | None
    apply_id: int | None = None
    id: int | None = None  # the incarnation (an instance id can come back after a stop)
    lost_kind: str | None = None  # 'preemption' / 'instance-lost' / 'stopped-by-kit' when this incarnation was lost
    shape: str | None = None
    price: float | None = None  # $/h (None: the spec's price for its market)


def _rowid(cursor: sqlite3.Cursor) -> int:
    """The id SQLite gave the row an INSERT just added."""
    if cursor.lastrowid is None:
        raise RuntimeError("INSERT returned no row id")
    return cursor.lastrowid


def _row(cls, row: sqlite3.Row):
    data = dict(row)
    if cls is Apply:
        data["adopted"] = bool(data["adopted"])
        data["nodes"] = json.loads(data["nodes"]) if data["nodes"] else None
    return cls(**data)


class Ledger:
    """All reads and writes of one cluster's ledger. Safe to share between the watcher loop
    and the HTTP server thread (one connection, serialised by a lock)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._check_readable()
        # FULL: a committed decision or apply record survives power loss, not just a crash.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        with self._lock:
            version = self._version()
            if version not in (0, 1, 2, 3, 4, 5, 6, 7, SCHEMA_VERSION):
                raise KitError(f"ledger schema version {version}, this kit writes {SCHEMA_VERSION}",
                               where=str(self.path), fix="use the kit version that created this ledger")
            if version == 1:
                self._migrate_from_1()
            self._db.executescript(SCHEMA + NODES_SCHEMA)
            if version in (1, 2):
                self._migrate_meta()
            self._add_columns()
            if not self._moves_allowed():  # read from the table, not the version: an older ledger's migration
                self._allow_moves()          # killed before it stamped the version reads as a new one
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _check_readable(self) -> None:
        """Refuse a damaged ledger before anything reads or writes it: SQLite's quick_check reads every page
        (a ledger is small) and finds a file that is not a database or whose pages are torn."""
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            problem = self._db.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.OperationalError:  # locked, read-only, ...: not damage, said as it is
            self._db.close()
            raise
        except sqlite3.DatabaseError as error:  # "file is not a database", "database disk image is malformed"
            problem = str(error)
        if problem != "ok":
            self._db.close()
            raise KitError(f"the ledger cannot be read: {problem}", where=str(self.path),
                           fix="the file is damaged or not kit's, and kit changed nothing: restore it from a copy if "
                               "you have one, or move it aside (a new `kit watch` then starts an empty ledger, "
                               "without the cost and history so far)")

    def _version(self) -> int:
        """0 for a new ledger; versions 1 and 2 kept theirs in a ``meta`` table."""
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version:
            return int(version)
        has_meta = self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
        if not has_meta:
            return 0
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate_from_1(self) -> None:
        """Version 1 keyed ``nodes`` by instance id (one row per instance, forever); version 2 has
        one row per incarnation and remembers how each was lost. Done in one transaction."""
        with self.transaction() as db:
            db.execute("ALTER TABLE nodes RENAME TO nodes_v1")
            for statement in NODES_SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"INSERT INTO nodes({NODE_COLUMNS}) SELECT {NODE_COLUMNS} FROM nodes_v1 ORDER BY since, rank")
            db.execute("DROP TABLE nodes_v1")
            # How each ended: from the confirmed loss events recorded for the instance.
            db.execute(
                "UPDATE nodes SET lost_kind = CASE"
                " WHEN EXISTS (SELECT 1 FROM events e WHERE e.instance = nodes.instance_id AND e.source != 'agent'"
                "              AND e.kind = 'preemption') THEN 'preemption'"
                " WHEN EXISTS (SELECT 1 FROM events e WHERE e.instance = nodes.instance_id AND e.source != 'agent'"
                "              AND e.kind = 'instance-lost') THEN 'instance-lost' END"
                " WHERE until IS NOT NULL")

    def _add_columns(self) -> None:
        """The columns versions 4 to 7 added, on an older ledger's tables (new ledgers are created with them)."""
        with self.transaction() as db:
            for table, column, kind in ADDED_COLUMNS:
                if not db.execute(f"SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?", (column,)).fetchone():
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def _moves_allowed(self) -> bool:
        """Whether ``decisions`` takes the ``move`` action (its CHECK constraint, as SQLite keeps its SQL)."""
        row = self._db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'decisions'").fetchone()
        return row is not None and "'move'" in row[0]

    def _allow_moves(self) -> None:
        """Version 8 adds the ``move`` action (a voluntary move to a cheaper offer). SQLite cannot alter a CHECK
        constraint, so ``decisions`` is rebuilt with the new one and its rows copied, in one transaction, as
        https://www.sqlite.org/lang_altertable.html#otheralter describes (foreign keys off meanwhile: ``applies``
        refers to it; checked before the commit)."""
        table = next(t for t in SCHEMA.split(";") if "CREATE TABLE IF NOT EXISTS decisions" in t)
        self._db.execute("PRAGMA foreign_keys=OFF")  # a no-op inside a transaction: set before it
        try:
            with self.transaction() as db:
                columns = ", ".join(r["name"] for r in db.execute("SELECT name FROM pragma_table_info('decisions')"))
                db.execute(table.replace("decisions (", "decisions_v8 (", 1))
                db.execute(f"INSERT INTO decisions_v8({columns}) SELECT {columns} FROM decisions")
                db.execute("DROP TABLE decisions")
                db.execute("ALTER TABLE decisions_v8 RENAME TO decisions")
                db.execute("CREATE INDEX IF NOT EXISTS decisions_status ON decisions(status)")
                if db.execute("PRAGMA foreign_key_check").fetchone():
                    raise KitError("ledger: decisions rebuilt for version 8 fail their foreign keys",
                                   where=str(self.path), fix="restore the ledger from a backup")
        finally:
            self._db.execute("PRAGMA foreign_keys=ON")

    def _migrate_meta(self) -> None:
        """Versions 1 and 2 kept the job's facts as text in a ``meta`` key-value table; version 3
        has them as typed columns of ``run``, capacity failures per market in their own table and
        bootstrap failures per decision. One transaction; ``meta`` is dropped."""
        with self.transaction() as db:
            if not db.execute("SELECT 1 FROM pragma_table_info('decisions') WHERE name = 'bootstrap_failures'"
                              ).fetchone():
                db.execute("ALTER TABLE decisions ADD COLUMN bootstrap_failures INTEGER NOT NULL DEFAULT 0")
            meta = {r["key"]: r["value"] for r in db.execute("SELECT key, value FROM meta").fetchall()}
            columns = {"job_started": float, "market": str, "params_sha256": str, "finished": int,
                       "observed_event_id": int, "local_clock_origin": float, "spot_blocked_until": float,
                       "wall_seconds_done": float}
            for key, kind in columns.items():
                if meta.get(key):
                    column = "clock_origin" if key == "local_clock_origin" else key
                    db.execute(f"UPDATE run SET {column} = ? WHERE id = 1", (kind(meta[key]),))
            for key, value in meta.items():
                if key.startswith("capacity_failures:"):
                    db.execute("INSERT OR REPLACE INTO capacity_failures(market, failures) VALUES (?, ?)",
                               (key.split(":", 1)[1], int(value)))
                elif key.startswith("bootstrap_failures:"):
                    db.execute("UPDATE decisions SET bootstrap_failures = ? WHERE id = ?",
                               (int(value), int(key.split(":", 1)[1])))
            db.execute("DROP TABLE meta")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._db.in_transaction:  # nested: part of the enclosing transaction
                yield self._db
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # ------------------------------------------------------------------ the job's own facts (run)
    def _run(self, column: str):
        return self._query(f"SELECT {column} FROM run WHERE id = 1")[0][0]

    def _set_run(self, column: str, value) -> None:
        with self.transaction() as db:
            db.execute(f"UPDATE run SET {column} = ? WHERE id = 1", (value,))

    def job_started(self, now: float) -> float:
        """When the job started (the first watcher's start); fixed once written."""
        with self.transaction() as db:
            db.execute("UPDATE run SET job_started = COALESCE(job_started, ?) WHERE id = 1", (now,))
        return float(self._run("job_started"))

    def started_at(self) -> float | None:
        return self._run("job_started")

    def params_sha256(self) -> str | None:
        """The trainer's final digest, from its "done" report (None before)."""
        return self._run("params_sha256")

    def finished(self) -> bool:
        return bool(self._run("finished"))

    def mark_finished(self) -> None:
        self._set_run("finished", 1)

    def ended_at(self) -> float | None:
        """When a finished job's last node was released (``kit train`` tears it down before it marks the run
        finished), on the ledger's clock; None while the job is not finished."""
        if not self.finished():
            return None
        ended = self._query("SELECT MAX(until) AS ended FROM nodes")[0]["ended"]
        return None if ended is None else float(ended)

    def last_record(self) -> float | None:
        """The newest time the ledger holds (a tick, a heartbeat, an event, a launch), on its clock: the last
        sign that the loop ran."""
        row = self._query(
            "SELECT MAX(t) AS t FROM (SELECT MAX(time) AS t FROM ticks UNION ALL SELECT MAX(time) FROM progress"
            " UNION ALL SELECT MAX(time) FROM events UNION ALL SELECT MAX(since) FROM nodes"
            " UNION ALL SELECT MAX(finished) FROM applies)")[0]
        return None if row["t"] is None else float(row["t"])

    def observed_event_id(self) -> int:
        return int(self._run("observed_event_id"))

    def clock(self) -> tuple[float, float | None, float] | None:
        """The local backend's compressed clock as :meth:`keep_clock` kept it, (origin, scale, offset)
        (kit.clock.VirtualClock), or None: the job's times are wall-clock times (a cloud's job,
        or nothing attached yet). The scale is None in a ledger from before it was kept."""
        row = self._query("SELECT clock_origin, clock_scale, clock_offset FROM run WHERE id = 1")[0]
        if row["clock_origin"] is None:
            return None
        scale = None if row["clock_scale"] is None else float(row["clock_scale"])
        return float(row["clock_origin"]), scale, float(row["clock_offset"] or 0.0)

    def keep_clock(self, origin: float, scale: float, offset: float) -> None:
        """The compressed clock the local backend attached, so that a continued run continues it and a
        reader that attaches nothing (``kit status`` of a running job) reads the times on it."""
        with self.transaction() as db:
            db.execute("UPDATE run SET clock_origin = ?, clock_scale = ?, clock_offset = ? WHERE id = 1",
                       (origin, scale, offset))

    def spot_blocked_until(self) -> float:
        return float(self._run("spot_blocked_until"))

    def block_spot_until(self, until: float) -> None:
        self._set_run("spot_blocked_until", until)

    def add_wall_seconds(self, seconds: float) -> float:
        """kit train's wall time over all its sessions, with ``seconds`` more."""
        with self.transaction() as db:
            db.execute("UPDATE run SET wall_seconds_done = wall_seconds_done + ? WHERE id = 1", (seconds,))
        return float(self._run("wall_seconds_done"))

    # ------------------------------------------------------------------ events and progress
    def record(self, event: Event) -> bool:
        """Store an event (heartbeats go to ``progress``). False when it was already recorded."""
        now = time.time()
        with self.transaction() as db:
            if event.kind == PROGRESS:
                if event.step is None or event.total_steps is None:
                    return False  # the agent heartbeats before the trainer wrote progress: nothing to keep
                db.execute(
                    "INSERT INTO progress(time, recorded, instance, node_rank, step, total_steps, step_time_s, state,"
                    " written, checkpoint_step, checkpoint_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (event.time, now, event.instance, event.node_rank, event.step, event.total_steps,
                     event.step_time_s, event.detail.get("state"), event.written, _checkpoint_step(event),
                     _checkpoint_bytes(event)))
                if event.detail.get("state") == "done" and event.detail.get("params_sha256"):
                    # the trainer's final digest: the export of the final checkpoint is checked against it
                    db.execute("UPDATE run SET params_sha256 = ? WHERE id = 1", (str(event.detail["params_sha256"]),))
                return True
            cursor = db.execute(
                "INSERT OR IGNORE INTO events(time, recorded, kind, instance, node_rank, source, detail, dedup_key)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (event.time, now, event.kind, event.instance, event.node_rank, event.source,
                 json.dumps(event.detail, sort_keys=True), event.dedup_key))
            return cursor.rowcount == 1

    def events(self, *, after_id: int = 0, kinds: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE id > ?"
        args: list[Any] = [after_id]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += list(kinds)
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in self._query(sql + " ORDER BY id", tuple(args))]

    def last_event_id(self) -> int:
        return self._query("SELECT COALESCE(MAX(id), 0) AS m FROM events")[0]["m"]

    def latest_progress(self) -> dict[str, Any] | None:
        """The newest heartbeat, by when the trainer wrote it: after a restart from an older checkpoint
        the job is back at that step, whatever it had reached before. The trainer's ``done`` is final, so
        once one is recorded it is the answer (a late heartbeat of a slower reporter does not undo it)."""
        rows = self._query("SELECT * FROM progress WHERE state = 'done' ORDER BY id DESC LIMIT 1") or \
            self._query(f"SELECT * FROM progress ORDER BY {WRITTEN} DESC, id DESC LIMIT 1")
        return dict(rows[0]) if rows else None

    def progress_history(self) -> list[tuple[float, int]]:
        """(time, step) of every recorded report, in the order the trainers wrote them: the job's path
        (:func:`_job_path`), setbacks included, and neither a stale report of a slower node nor a crossing of
        two nodes' reports read as one."""
        rows = self._query(f"SELECT time, step, instance, node_rank, {WRITTEN} AS w FROM progress ORDER BY w, id")
        return _job_path(rows, self._node_starts())

    def _node_starts(self) -> list[float]:
        """When each node incarnation came up, on the trainers' clock (the wall clock: the local backend's
        compressed one converted back, kit.clock.VirtualClock), in order. None are known on a ledger that kept
        a compressed clock from before it kept its scale."""
        from kit.clock import VirtualClock

        starts = [float(r["since"]) for r in self._query("SELECT DISTINCT since FROM nodes ORDER BY since")]
        clock = self.clock()
        if clock is None:
            return starts
        origin, scale, offset = clock
        return [] if scale is None else [VirtualClock(origin, scale, offset=offset).wall_at(t) for t in starts]

    def step_written_by(self, wall: float) -> int:
        """The highest step any trainer had written by the wall-clock moment ``wall`` (-1: none)."""
        row = self._query(f"SELECT MAX(step) AS s FROM progress WHERE {WRITTEN} <= ?", (wall,))[0]
        return -1 if row["s"] is None else int(row["s"])

    def newest_checkpoint_of(self, instances: Collection[str]) -> int:
        """The newest complete checkpoint any of ``instances`` reported (-1: none)."""
        if not instances:
            return -1
        marks = ", ".join("?" * len(instances))
        row = self._query(f"SELECT MAX(checkpoint_step) AS s FROM progress WHERE instance IN ({marks})",
                          tuple(instances))[0]
        return -1 if row["s"] is None else int(row["s"])

    def checkpoint_reports_after(self, wall: float) -> list[tuple[str, float, int]]:
        """(instance, written, checkpoint step) of every report of a complete checkpoint written after the
        wall-clock moment ``wall``, oldest first."""
        rows = self._query(f"SELECT instance, {WRITTEN} AS w, checkpoint_step FROM progress WHERE {WRITTEN} > ?"
                           " AND checkpoint_step IS NOT NULL ORDER BY w, id", (wall,))
        return [(r["instance"], float(r["w"]), int(r["checkpoint_step"])) for r in rows]

    def checkpoint_gb(self) -> float | None:
        """The size (GB) of the newest checkpoint a node reported, by when it wrote the report (None: none yet)."""
        rows = self._query("SELECT checkpoint_bytes FROM progress WHERE checkpoint_bytes IS NOT NULL"
                           f" ORDER BY {WRITTEN} DESC, id DESC LIMIT 1")
        return rows[0]["checkpoint_bytes"] / 1e9 if rows else None

    def recent_step_times(self, limit: int | None = 20) -> list[float]:
        """Measured step times (seconds of the ledger's clock), newest first; all of them when
        ``limit`` is None."""
        sql = "SELECT step_time_s FROM progress WHERE step_time_s > 0 ORDER BY id DESC"
        rows = self._query(sql + " LIMIT ?", (limit,)) if limit is not None else self._query(sql)
        return [r["step_time_s"] for r in rows]

    def first_progress_after(self, when: float) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM progress WHERE time >= ? ORDER BY id LIMIT 1", (when,))
        return dict(rows[0]) if rows else None

    def done_at(self) -> float | None:
        """When the trainer's first ``done`` was recorded."""
        rows = self._query("SELECT time FROM progress WHERE state = 'done' ORDER BY id LIMIT 1")
        return rows[0]["time"] if rows else None

    # ------------------------------------------------------------------ policy ticks
    def record_tick(self, now: float, observation: dict | None, decision: str | None, *,
                    observed_event_id: int | None = None) -> None:
        """The observation the policy saw and the events it covered, in one transaction: a crash
        can neither replay a tick whose events are then seen again, nor lose one."""
        with self.transaction() as db:
            if observation is not None:
                db.execute("INSERT INTO ticks(time, observation, decision) VALUES (?, ?, ?)",
                           (now, json.dumps(observation, sort_keys=True), decision))
            if observed_event_id is not None:
                db.execute("UPDATE run SET observed_event_id = ? WHERE id = 1", (int(observed_event_id),))

    def amend_last_tick(self, observation: dict, decision: str) -> None:
        """Replace the newest tick's observation and decision (the watcher asked its policy again in that
        tick: its capacity search found no spot)."""
        with self.transaction() as db:
            db.execute("UPDATE ticks SET observation = ?, decision = ? WHERE id = (SELECT MAX(id) FROM ticks)",
                       (json.dumps(observation, sort_keys=True), decision))

    def last_interruption(self) -> tuple[float, int] | None:
        """(time, step) of the newest tick whose observation is marked as the job's interruption
        (``INTERRUPTED_AT``): when it was, and the step the job had reached; None before any."""
        rows = self._query(f"SELECT time, {_INTERRUPTED_STEP} AS step FROM ticks WHERE {_INTERRUPTED_STEP} IS NOT NULL"
                           " ORDER BY id DESC LIMIT 1")
        return (float(rows[0]["time"]), int(rows[0]["step"])) if rows else None

    def interruptions(self) -> int:
        """How many interruptions of the job the watcher counted (ticks marked ``INTERRUPTED_AT``): a gang
        whose nodes were lost over several polls is one, as the policy saw it."""
        return int(self._query(f"SELECT COUNT(*) AS n FROM ticks WHERE {_INTERRUPTED_STEP} IS NOT NULL")[0]["n"])

    def ticks(self) -> list[dict[str, Any]]:
        return [{"time": r["time"], "observation": json.loads(r["observation"]), "decision": r["decision"]}
                for r in self._query("SELECT * FROM ticks ORDER BY id")]

    # ------------------------------------------------------------------ decisions
    def begin_decision(self, *, policy: str, decision: str, action: str, market_before: str | None,
                       market_after: str | None, reason: str, now: float) -> int:
        """Commit a new pending decision; any older pending one is superseded in the same step."""
        with self.transaction() as db:
            self.supersede_pending(now)
            cursor = db.execute(
                "INSERT INTO decisions(created, policy, decision, action, market_before, market_after, reason, status)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'pending')",
                (now, policy, decision, action, market_before, market_after, reason))
            return _rowid(cursor)

    def decision(self, decision_id: int) -> Decision:
        return _row(Decision, self._query("SELECT * FROM decisions WHERE id = ?", (decision_id,))[0])

    def pending_decision(self) -> Decision | None:
        rows = self._query("SELECT * FROM decisions WHERE status = 'pending' ORDER BY id DESC LIMIT 1")
        return _row(Decision, rows[0]) if rows else None

    def decisions(self, limit: int | None = None) -> list[Decision]:
        sql = "SELECT * FROM decisions ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [_row(Decision, r) for r in self._query(sql)]

    def last_decision(self, action: str) -> Decision | None:
        """The newest decision with ``action``, or None."""
        rows = self._query("SELECT * FROM decisions WHERE action = ? ORDER BY id DESC LIMIT 1", (action,))
        return _row(Decision, rows[0]) if rows else None

    def supersede_pending(self, now: float, why: str | None = None) -> None:
        """The pending decision is no longer wanted. An attempt of it that had applied (only its
        bootstrap was outstanding) is over too: a restart must not bootstrap those nodes."""
        with self.transaction() as db:
            db.execute("UPDATE applies SET status = 'interrupted', finished = ? WHERE status = 'applied'"
                       " AND decision_id IN (SELECT id FROM decisions WHERE status = 'pending')", (now,))
            db.execute("UPDATE decisions SET status = 'superseded', finished = ?, error = COALESCE(?, error)"
                       " WHERE status = 'pending'", (now, why))

    def fail_decision(self, decision_id: int, error: str, now: float) -> None:
        with self.transaction() as db:
            db.execute("UPDATE decisions SET status = 'failed', error = ?, finished = ? WHERE id = ?",
                       (error, now, decision_id))

    def reopen_decision(self, decision_id: int) -> None:
        """A decision given up after its bootstrap failed is pending again, its bootstrap failures counted
        from zero: a restarted watcher retries the bootstrap the person it stopped for has fixed."""
        with self.transaction() as db:
            db.execute("UPDATE decisions SET status = 'pending', finished = NULL, bootstrap_failures = 0, "
                       "next_attempt = 0 WHERE id = ?", (decision_id,))

    # ------------------------------------------------------------------ applies
    def start_apply(self, decision_id: int, market: str | None, now: float) -> int:
        with self.transaction() as db:
            db.execute("UPDATE decisions SET attempts = attempts + 1 WHERE id = ?", (decision_id,))
            return _rowid(db.execute(
                "INSERT INTO applies(decision_id, started, market, status) VALUES (?, ?, ?, 'started')",
                (decision_id, now, market)))

    def set_apply_offer(self, apply_id: int, offer: str) -> None:
        """The offer an attempt ended up applying (a capacity search may pass several)."""
        with self.transaction() as db:
            db.execute("UPDATE applies SET offer = ? WHERE id = ?", (offer, apply_id))

    def applied_offer(self) -> str | None:
        """The offer of the newest apply that reached the cloud (None: nothing applied, or a release)."""
        rows = self._query("SELECT offer, market FROM applies WHERE nodes IS NOT NULL ORDER BY id DESC LIMIT 1")
        return rows[0]["offer"] if rows and rows[0]["market"] is not None else None

    def applied_offers(self) -> list[str]:
        """The offer of every apply that reached the cloud, in order (releases and older ledgers left out)."""
        return [r["offer"] for r in self._query(
            "SELECT offer FROM applies WHERE nodes IS NOT NULL AND market IS NOT NULL AND offer IS NOT NULL ORDER BY id")]

    def applies(self, *, decision_id: int | None = None, status: str | None = None) -> list[Apply]:
        sql = "SELECT * FROM applies WHERE 1=1"
        args: list[Any] = []
        if decision_id is not None:
            sql, args = sql + " AND decision_id = ?", args + [decision_id]
        if status is not None:
            sql, args = sql + " AND status = ?", args + [status]
        return [_row(Apply, r) for r in self._query(sql + " ORDER BY id", tuple(args))]

    def mark_applied(self, apply_id: int, nodes: list[dict], *, market: str | None, now: float,
                     adopted: bool = False) -> None:
        """The backend converged (or was found converged after a crash): the cloud runs ``nodes``
        on ``market`` now (nothing when ``market`` is None: a release), whether or not the
        bootstrap that follows succeeds. Node table and market say so at once."""
        with self.transaction() as db:
            db.execute("UPDATE applies SET status = 'applied', nodes = ?, adopted = ? WHERE id = ?",
                       (json.dumps(nodes, sort_keys=True), int(adopted), apply_id))
            self._deployed(db, apply_id, nodes, market, now)
            if market is not None:  # a launch on this market worked: its capacity backoff starts over
                db.execute("DELETE FROM capacity_failures WHERE market = ?", (market,))

    def last_capacity_failure(self, market: str) -> float | None:
        """When the newest apply on ``market`` that found no capacity ended, or None."""
        rows = self._query("SELECT MAX(finished) AS t FROM applies WHERE status = 'capacity' AND market = ?", (market,))
        return rows[0]["t"] if rows and rows[0]["t"] is not None else None

    def capacity_failures(self, market: str | None) -> int:
        """Capacity failures on ``market`` since its last successful apply (across decisions)."""
        rows = self._query("SELECT failures FROM capacity_failures WHERE market = ?", (market,))
        return int(rows[0]["failures"]) if rows else 0

    def fail_apply(self, apply_id: int, decision_id: int, error: str, *, capacity: bool, next_attempt: float,
                   now: float) -> None:
        with self.transaction() as db:
            db.execute("UPDATE applies SET status = ?, error = ?, finished = ? WHERE id = ?",
                       ("capacity" if capacity else "failed", error, now, apply_id))
            db.execute("UPDATE decisions SET next_attempt = ?, error = ? WHERE id = ?", (next_attempt, error, decision_id))
            if capacity:
                market = db.execute("SELECT market FROM applies WHERE id = ?", (apply_id,)).fetchone()["market"]
                db.execute("INSERT INTO capacity_failures(market, failures) VALUES (?, 1) ON CONFLICT(market)"
                           " DO UPDATE SET failures = failures + 1", (market,))

    def count_bootstrap_failure(self, decision_id: int) -> int:
        """One more failed bootstrap of this decision's nodes; how many so far."""
        with self.transaction() as db:
            db.execute("UPDATE decisions SET bootstrap_failures = bootstrap_failures + 1 WHERE id = ?", (decision_id,))
            return int(db.execute("SELECT bootstrap_failures FROM decisions WHERE id = ?", (decision_id,)
                                  ).fetchone()[0])

    def retry_later(self, decision_id: int, next_attempt: float, error: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE decisions SET next_attempt = ?, error = ? WHERE id = ?", (next_attempt, error, decision_id))

    def mark_interrupted(self, apply_id: int, now: float) -> None:
        with self.transaction() as db:
            db.execute("UPDATE applies SET status = 'interrupted', finished = ? WHERE id = ?", (now, apply_id))

    def finish_apply(self, apply_id: int, decision_id: int, nodes: list[dict], market: str | None, now: float) -> None:
        """One transaction: the attempt is ok, the decision done, and the node table says who runs
        now (already true since ``mark_applied``; repeated, idempotently, for older ledgers)."""
        with self.transaction() as db:
            db.execute("UPDATE applies SET status = 'ok', finished = ? WHERE id = ?", (now, apply_id))
            db.execute("UPDATE decisions SET status = 'done', finished = ?, error = NULL WHERE id = ?", (now, decision_id))
            self._deployed(db, apply_id, nodes, market, now)

    @staticmethod
    def _deployed(db: sqlite3.Connection, apply_id: int, nodes: list[dict], market: str | None, now: float) -> None:
        """Make the node table match a converged deployment. Idempotent: a node that is already up
        under the same id and market keeps its row (its cost runs on from ``since``)."""
        if market is None and not nodes:  # released: the instances were deleted on purpose, disks kept
            db.execute("UPDATE nodes SET state = 'released', until = COALESCE(until, ?) WHERE state IN ('up', 'lost')",
                       (now,))
            db.execute("UPDATE run SET market = NULL WHERE id = 1")
            return
        keep = {str(n["instance_id"]) for n in nodes}
        for row in db.execute("SELECT id, instance_id, state FROM nodes WHERE state IN ('up', 'lost')").fetchall():
            if row["instance_id"] not in keep or row["state"] == "lost":
                # Replaced by another instance, or lost and now back under the same id (a stopped
                # GCP spot VM restarted): that incarnation ended. A lost one stopped costing when
                # it was lost (``until`` already set).
                db.execute("UPDATE nodes SET state = 'replaced', until = COALESCE(until, ?) WHERE id = ?",
                           (now, row["id"]))
        for rank, node in enumerate(nodes):
            instance_id = str(node["instance_id"])
            node_market = node.get("market") or market
            current = db.execute("SELECT id, market FROM nodes WHERE instance_id = ? AND state = 'up'",
                                 (instance_id,)).fetchone()
            if current is not None and current["market"] == node_market:
                db.execute("UPDATE nodes SET rank = ?, private_ip = ?, public_ip = ? WHERE id = ?",
                           (node.get("rank", rank), node.get("private_ip"), node.get("public_ip"), current["id"]))
                continue
            if current is not None:  # same id on another market (not seen on real clouds): a new run
                db.execute("UPDATE nodes SET state = 'replaced', until = ? WHERE id = ?", (now, current["id"]))
            db.execute(
                "INSERT INTO nodes(instance_id, name, rank, market, zone, private_ip, public_ip, disk_id, state,"
                " since, apply_id, shape, price) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'up', ?, ?, ?, ?)",
                (instance_id, node.get("name") or f"node-{rank}", node.get("rank", rank), node_market,
                 node.get("zone"), node.get("private_ip"), node.get("public_ip"), node.get("disk_id"), now, apply_id,
                 node.get("shape"), node.get("price")))
        db.execute("UPDATE run SET market = ? WHERE id = 1", (market or None,))

    def applied_markets(self) -> list[str]:
        """The market of every apply that reached the cloud, in order (releases left out): what the
        cluster actually ran on, including applies whose decision was superseded before bootstrap."""
        return [r["market"] for r in self._query(
            "SELECT market FROM applies WHERE nodes IS NOT NULL AND market IS NOT NULL ORDER BY id")]

    def first_launch_started(self) -> float | None:
        """When the apply of the job's first launch began (None when the first deployment was
        adopted, i.e. made before the first watcher)."""
        rows = self._query("SELECT started, adopted FROM applies WHERE nodes IS NOT NULL AND market IS NOT NULL"
                           " ORDER BY id LIMIT 1")
        return rows[0]["started"] if rows and not rows[0]["adopted"] else None

    def action_durations(self, limit: int = 20) -> list[float]:
        """How long the last ``limit`` finished attempts took, apply to end of bootstrap (seconds of
        the ledger's clock): during one the loop decides nothing."""
        rows = self._query("SELECT finished - started AS d FROM applies WHERE finished IS NOT NULL"
                           " AND status IN ('ok', 'failed', 'capacity') ORDER BY id DESC LIMIT ?", (limit,))
        return [max(0.0, r["d"]) for r in rows]

    # ------------------------------------------------------------------ nodes
    def disks(self) -> list[dict[str, Any]]:
        """Every data disk the job's nodes used, in order of first use: id, zone, ``first_used`` (the first
        node on it came up), ``last_until`` (the last one on it ended; -1 while none has) and
        ``attached_now`` (how many nodes on it are up)."""
        return [dict(r) for r in self._query(
            "SELECT disk_id, zone, MIN(since) AS first_used, MAX(COALESCE(until, -1)) AS last_until,"
            " SUM(state = 'up') AS attached_now FROM nodes WHERE disk_id IS NOT NULL GROUP BY disk_id, zone"
            " ORDER BY first_used, disk_id")]

    def nodes(self, states: tuple[str, ...] = ("up", "lost")) -> list[NodeRow]:
        sql = f"SELECT * FROM nodes WHERE state IN ({','.join('?' * len(states))}) ORDER BY rank, since, id"
        return [_row(NodeRow, r) for r in self._query(sql, states)]

    def all_nodes(self) -> list[NodeRow]:
        return [_row(NodeRow, r) for r in self._query("SELECT * FROM nodes ORDER BY since, rank, id")]

    def mark_lost(self, instance_id: str, when: float, kind: str = "instance-lost") -> bool:
        """The cloud confirmed that ``instance_id`` is gone (``kind``: the event kind). True when this
        ended the running incarnation. A later, more specific report (a GCP preempted operation
        after the instance was seen missing) upgrades how the incarnation running at ``when`` was lost,
        if it was: an id restarted after a stop has had several, and the operation, listed late and
        dated when the preemption began, is no fact about an earlier or later one."""
        with self.transaction() as db:
            # never before the incarnation began: a stale cloud timestamp (a stop of the previous incarnation)
            # or clocks that disagree would end it before it started, and bill it nothing
            if db.execute("UPDATE nodes SET state = 'lost', until = MAX(?, since), lost_kind = ? WHERE instance_id = ?"
                          " AND state = 'up'", (when, kind, instance_id)).rowcount == 1:
                return True
            if kind == "preemption":
                db.execute("UPDATE nodes SET lost_kind = 'preemption' WHERE id = (SELECT id FROM nodes WHERE"
                           " instance_id = ? AND since <= ? AND ? <= until ORDER BY since DESC, id DESC LIMIT 1)"
                           " AND lost_kind IS NOT NULL", (instance_id, when, when))
            return False

    def release_nodes(self, now: float) -> None:
        """Instances deleted on purpose (disks kept): they stop costing now."""
        with self.transaction() as db:
            self._deployed(db, 0, [], None, now)

    def adopt_deployment(self, nodes: list[dict], market: str, policy: str, now: float) -> None:
        """Record a deployment made before the first watcher (``kit apply``) in one transaction:
        a done ``launch`` decision, an adopted ``ok`` apply and its nodes."""
        with self.transaction() as db:
            decision = _rowid(db.execute(
                "INSERT INTO decisions(created, policy, decision, action, market_before, market_after, reason, status,"
                " finished) VALUES (?, ?, ?, 'launch', NULL, ?, 'adopted the deployment found at start', 'done', ?)",
                (now, policy, market, market, now)))
            attempt = _rowid(db.execute(
                "INSERT INTO applies(decision_id, started, finished, market, status, adopted, nodes)"
                " VALUES (?, ?, ?, ?, 'applied', 1, ?)",
                (decision, now, now, market, json.dumps(nodes, sort_keys=True))))
            self.finish_apply(attempt, decision, nodes, market, now)  # nested: RLock, same transaction

    def market(self) -> str | None:
        """The market of the deployed cluster (None: nothing deployed)."""
        return self._run("market") or None


class WatcherLock:
    """Exclusive per-cluster lock; a second ``kit watch`` on the same cluster fails fast."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> WatcherLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise KitError(f"another watcher (pid {holder}) is already watching this cluster",
                           where=str(self.path), fix="stop that `kit watch` first, or use `kit status` to read the ledger")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    @staticmethod
    def held(path: Path) -> bool:
        """Whether a watcher holds the lock at ``path`` now (a reader's question: it takes the lock shared for
        an instant, which only a watcher starting in that instant would notice)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops a lock it took
        return False

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WatcherLock:  # noqa: PYI034
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
