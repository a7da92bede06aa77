"""The session registry: one sqlite file (WAL) shared by every local process.

Two notebooks, the Jupyter server and the CLI read and write it at once; each write is one
`BEGIN IMMEDIATE` transaction, so no record is lost or half-written. Every state change is an
event row with its time: cost and the timeline are computed from those rows.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import sqlite3
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

from ..configuration.settings import data_folder, data_folder_error
from ..core.errors import BadInput, UnknownSession, WorkspaceInUse
from ..core.models import Event, LaunchSpec, SessionRecord, State, now
from ..core.procs import alive, start_ticks
from ..core.textvalues import MAX_NAME, session_name

_HEX = set("0123456789abcdef")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    owner TEXT NOT NULL,
    price_per_hour REAL NOT NULL DEFAULT 0,
    resource TEXT NOT NULL DEFAULT '{}',
    error TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS sessions_active_name
    ON sessions(name) WHERE state NOT IN ('stopped', 'failed');
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    state TEXT NOT NULL,
    at REAL NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS events_session ON events(session_id, seq);
CREATE TABLE IF NOT EXISTS failed_hosts (
    backend TEXT NOT NULL,
    host TEXT NOT NULL,
    at REAL NOT NULL,
    error TEXT NOT NULL,
    PRIMARY KEY (backend, host)
);
"""


def owner_id(pid: int | None = None) -> str:
    """Who started a session: user@host:pid:start (start: the process's start time in clock
    ticks, so gc tells a dead owner from a later process that got the same pid). `pid`: another
    process of this user on this host (the Jupyter server names a notebook's kernel so, to
    connect it to a session); this process by default."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    pid = os.getpid() if pid is None else pid
    started = start_ticks(pid)
    return f"{user}@{socket.gethostname()}:{pid}" + (f":{started}" if started is not None else "")


def owner_is_dead(owner: str) -> bool:
    """True when the owner ran on this host and is gone: its pid no longer runs, is a zombie,
    or belongs to a later process (owner ids carry the start time: user@host:pid:start). An
    owner on another host is never taken for dead: nothing here can tell."""
    try:
        who, _, rest = owner.partition(":")
        host = who.split("@", 1)[1]
        pid_text, _, start_text = rest.partition(":")
        pid = int(pid_text)
        started = int(start_text) if start_text else None
    except (ValueError, IndexError):
        return False
    if host != socket.gethostname():
        return False
    return not alive(pid, started)


#: states a session passes through while one process drives it (its `driver`): left in one by a
#: process that died, a session is settled by the next one that reads it (session/orphans.py)
DRIVEN_STATES = (State.REQUESTED, State.PROVISIONING, State.STARTING, State.STOPPING)


def driver_of(record: SessionRecord) -> str:
    """The process moving a session through its current (driven) state: who made it move last
    (`resource["driver"]`, written with each transition into a driven state), else its owner."""
    return record.resource.get("driver") or record.owner


def _free_name(spec: LaunchSpec, taken: set[str]) -> str:
    """A session started on a workspace (resumed, or named) is called after it: `ux-nb`, then
    `ux-nb-2` while that is taken; any other after its GPU type: `t4-1`, `t4-2`, ..."""
    workspace = spec.extra.get("resume") or spec.extra.get("workspace")
    if workspace:
        n = 1
        while (name := _numbered(workspace, n)) in taken:
            n += 1
        return name
    n = 1
    while f"{spec.gpu_type}-{n}" in taken:
        n += 1
    return f"{spec.gpu_type}-{n}"


def _numbered(base: str, n: int) -> str:
    """`base`, or `base-n` from 2 on, cut to fit a name's length."""
    if n == 1:
        return base
    suffix = f"-{n}"
    return base[: MAX_NAME - len(suffix)] + suffix


def validate_name(name: str) -> str:
    return session_name(name)  # the option table's rule (gpusession/core/textvalues.py)


def _name_taken(db: sqlite3.Connection, name: str, taken: set[str]) -> BadInput:
    """A name stays with its record while the record exists (a failed or stopped session's too),
    so every command that takes a name finds one session: the refusal, with a free name."""
    row = db.execute(
        "SELECT state FROM sessions WHERE name=? ORDER BY created_at DESC LIMIT 1", (name,)
    ).fetchone()
    n = 2
    while (free := _numbered(name, n)) in taken:
        n += 1
    if row["state"] not in ("stopped", "failed"):
        return BadInput(
            f"a session named {name!r} is already active; stop it or pick another name ({free} is free)"
        )
    return BadInput(
        f"a session named {name!r} exists already ({row['state']}; a name stays with its session "
        f"so that every command finds one): pick another name, such as {free}"
    )


RETIRED_MARK = "~"  # a retired name: `t4-3~1`, never a name a user can give (session_name)


def _retired_name(name: str, taken: set[str]) -> str:
    n = 1
    while (retired := f"{name}{RETIRED_MARK}{n}") in taken:
        n += 1
    return retired


def _check_claim(
    db: sqlite3.Connection, claim: Callable[[LaunchSpec, str], Any], spec: LaunchSpec, name: str
) -> None:
    mine = claim(spec, name)
    if mine is None:
        return
    for row in db.execute(
        "SELECT name, state, spec FROM sessions WHERE state NOT IN ('stopped','failed')"
    ):
        if claim(LaunchSpec.from_dict(json.loads(row["spec"])), row["name"]) == mine:
            ws, other = mine[-1], row["name"]
            raise WorkspaceInUse(
                f"workspace {ws} is in use by session {other} ({row['state']}); stop it first "
                f"(`gpusession stop {other} --save` keeps its variables for `--resume {ws}`), "
                "or give this session another --workspace"
            )


class _Hold:
    """One idle connection kept open over a run of the store's uses (a start: 12-15 of them,
    Store.held), never used for a statement after its first read. SQLite's last connection to
    close checkpoints the WAL into the database and deletes it (fsyncs, two files removed and
    made again by the next open): with this one open no other close is the last, which was half
    of each use's time (measured: a warm start's store share 40-44 ms -> 22-23 ms quiet). Every
    read and write still opens a connection of its own, so none sees an old snapshot.

    Fork-safe: SQLite must never have an open connection carried across a fork (a child that
    inherits one inherits SQLite's view of locks only its parent holds, and a close there may
    checkpoint and delete a WAL the parent writes): every hold is closed before a fork
    (os.register_at_fork), opened again after it in the parent, and never in the child; the
    lock is held across the fork, so no hold is opened meanwhile. A `subprocess` child execs
    without Python's fork hooks and runs no SQLite code."""

    _live: weakref.WeakSet[_Hold] = weakref.WeakSet()
    _lock = threading.RLock()

    def __init__(self, path: Path):
        self.path = path
        self.db: sqlite3.Connection | None = None
        with self._lock:
            self._open()
            self._live.add(self)

    def _open(self) -> None:
        try:
            db = sqlite3.connect(
                self.path, timeout=30, isolation_level=None, check_same_thread=False
            )
            db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # maps the WAL's index
        except sqlite3.Error:
            return  # the uses go on without it, as they did before
        self.db = db

    def _shut(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            db.close()

    def close(self) -> None:
        with self._lock:
            self._live.discard(self)
            self._shut()

    @classmethod
    def _before_fork(cls) -> None:
        cls._lock.acquire()  # released after the fork, in the parent; the child has its own
        for hold in list(cls._live):
            hold._shut()

    @classmethod
    def _after_in_parent(cls) -> None:
        try:
            for hold in list(cls._live):
                hold._open()
        finally:
            cls._lock.release()

    @classmethod
    def _after_in_child(cls) -> None:
        cls._live = weakref.WeakSet()  # the parent's holds end with the fork here, closed
        cls._lock = threading.RLock()


os.register_at_fork(
    before=_Hold._before_fork,
    after_in_parent=_Hold._after_in_parent,
    after_in_child=_Hold._after_in_child,
)


class Store:
    """Durable session records. Cheap to create; safe to share between threads and processes."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        try:  # a folder it cannot use (a file in its place, read-only) is one line, not a traceback
            data_folder(self.path.parent)
            # made 0600 before sqlite opens it: its -wal and -shm files take the database's mode
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            with self._connect() as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_SCHEMA)
        except (OSError, sqlite3.OperationalError) as exc:
            raise data_folder_error(self.path.parent, exc) from None
        self._holding = 0
        self._hold: _Hold | None = None
        self._closing: threading.Thread | None = None  # the last hold's close (held)
        self._hold_lock = threading.Lock()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Over a run of uses (a start's), one idle connection open beside them (_Hold): no use's
        close is the last, so none checkpoints and deletes the WAL; the run's end does that once,
        in a thread of its own (`checkpointed` waits for it). Nests; any thread."""
        with self._hold_lock:
            self._holding += 1
            if self._hold is None:
                self._hold = _Hold(self.path)
        try:
            yield
        finally:
            with self._hold_lock:
                self._holding -= 1
                hold = self._hold if self._holding == 0 else None
                if hold is not None:
                    self._hold = None
            if hold is not None:
                # its close checkpoints the WAL (writes and fsyncs the database: 1 ms, 6 ms at
                # load 4), off the caller's way: a start's session is the caller's sooner. The
                # checkpoint is SQLite's own: a process that ends first leaves the WAL for the
                # next open to read, nothing lost
                closing = threading.Thread(
                    target=hold.close, name="gpusession-store-checkpoint", daemon=False
                )
                closing.start()
                self._closing = closing

    def checkpointed(self, timeout: float = 30) -> None:
        """Until the last hold's close (its checkpoint) has ended."""
        closing = self._closing
        if closing is not None:
            closing.join(timeout)

    @property
    def store_id(self) -> str:
        """This store among others on a shared engine or account: host and path, hashed (what
        remote labels carry, so gc collects only its own store's resources)."""
        import hashlib

        where = f"{socket.gethostname()}:{os.path.realpath(self.path)}"
        return hashlib.sha256(where.encode()).hexdigest()[:16]

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)  # busy: wait 30 s
        try:
            db.execute("PRAGMA foreign_keys=ON")
            # WAL's own recommendation: a commit is not fsynced, the checkpoint is (a process
            # killed loses nothing; a power cut may take the last commits back, never the file's
            # consistency, and what a start made is labelled on its engine for gc); each commit's
            # fsync was half a write's time at load 4
            db.execute("PRAGMA synchronous=NORMAL")
            db.row_factory = sqlite3.Row
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")

    # -- writes -------------------------------------------------------------------------

    def create(
        self,
        spec: LaunchSpec,
        *,
        price_per_hour: float,
        owner: str | None = None,
        claim: Callable[[LaunchSpec, str], Any] | None = None,
        resource: dict[str, Any] | None = None,
    ) -> SessionRecord:
        """Record a new session in state `requested`; picks a free name when spec.name is None.
        `claim(spec, name)`: what the session holds while active (its workspace); refused in the
        same transaction when an active session holds it (two starts at once: one gets it).
        `resource`: what the record holds from its first moment (a switch's intent)."""
        import uuid  # (with `platform`: not for a process that only lists)

        sid = uuid.uuid4().hex
        t = now()
        with self._write() as db:
            taken = {r[0] for r in db.execute("SELECT name FROM sessions")}
            if spec.name:
                name = validate_name(spec.name)
                if name in taken:
                    raise _name_taken(db, name, taken)
            else:
                name = _free_name(spec, taken)
            spec.name = name
            if claim is not None:
                _check_claim(db, claim, spec, name)
            db.execute(
                "INSERT INTO sessions (id, name, state, spec, created_at, updated_at, owner,"
                " price_per_hour, resource) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    sid,
                    name,
                    State.REQUESTED.value,
                    json.dumps(spec.to_dict()),
                    t,
                    t,
                    owner or owner_id(),
                    price_per_hour,
                    json.dumps(resource or {}),
                ),
            )
            db.execute(
                "INSERT INTO events (session_id, state, at, detail) VALUES (?,?,?,?)",
                (sid, State.REQUESTED.value, t, f"{spec.backend} {spec.gpu_type}:{spec.gpu_count}"),
            )
            return self._by_id(db, sid)

    def transition(
        self,
        session_id: str,
        state: State,
        detail: str = "",
        *,
        error: str | None = None,
        at: float | None = None,
        expect: State | None = None,
    ) -> SessionRecord:
        """Move a session to `state` and record the event. Terminal states stay terminal.
        `expect`: only from that state (what the caller saw); else nothing is recorded."""
        t = now() if at is None else at
        with self._write() as db:
            row = db.execute("SELECT state FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise UnknownSession(f"no session with id {session_id}")
            current = State(row["state"])
            if expect is not None and current != expect:
                pass  # it moved on meanwhile (another process stops it): theirs to record
            elif not current.active and state != current:
                # a stopped session cannot come back; record nothing (another process won the race)
                pass
            elif current != state or detail:
                db.execute(
                    "UPDATE sessions SET state=?, updated_at=?, error=COALESCE(?, error) WHERE id=?",
                    (state.value, t, error, session_id),
                )
                db.execute(
                    "INSERT INTO events (session_id, state, at, detail) VALUES (?,?,?,?)",
                    (session_id, state.value, t, detail),
                )
                if state in DRIVEN_STATES and state != current:  # this process drives it now
                    self._merge(db, session_id, driver=owner_id())
            return self._by_id(db, session_id)

    def take_over(self, session_id: str, driver: str, state: State) -> SessionRecord | None:
        """Become the driver of a session still in `state` under `driver` (a process found
        dead): the record, now driven by this process, or None when it moved on or another
        process took it over first (two faces reading at once settle it once)."""
        with self._write() as db:
            row = db.execute(
                "SELECT state, owner, resource FROM sessions WHERE id=?", (session_id,)
            ).fetchone()
            if row is None:
                raise UnknownSession(f"no session with id {session_id}")
            resource = json.loads(row["resource"])
            if State(row["state"]) != state:
                return None
            if (resource.get("driver") or row["owner"]) != driver:
                return None
            self._merge(db, session_id, driver=owner_id())
            return self._by_id(db, session_id)

    @staticmethod
    def _merge(db: sqlite3.Connection, session_id: str, **values: Any) -> None:
        row = db.execute("SELECT resource FROM sessions WHERE id=?", (session_id,)).fetchone()
        resource = json.loads(row["resource"])
        resource.update(values)
        db.execute("UPDATE sessions SET resource=? WHERE id=?", (json.dumps(resource), session_id))

    def update_resource(self, session_id: str, **values: Any) -> SessionRecord:
        """Merge backend state (container id, ports, instance id...) into the record."""
        with self._write() as db:
            row = db.execute("SELECT resource FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise UnknownSession(f"no session with id {session_id}")
            resource = json.loads(row["resource"])
            resource.update(values)
            db.execute(
                "UPDATE sessions SET resource=?, updated_at=? WHERE id=?",
                (json.dumps(resource), now(), session_id),
            )
            return self._by_id(db, session_id)

    # -- hosts a listing could not reach (remembered, so later listings do not wait on them) --

    def host_failed(self, backend: str, host: str, error: str, at: float | None = None) -> None:
        """A backend's host did not answer a listing (`gpusession workspaces`)."""
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO failed_hosts (backend, host, at, error) VALUES (?,?,?,?)",
                (backend, host, now() if at is None else at, error),
            )

    def failed_hosts(self, backend: str | None = None) -> dict[tuple[str, str], tuple[float, str]]:
        """(backend, host) -> (when it failed, why), of one backend or all."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT backend, host, at, error FROM failed_hosts"
                + (" WHERE backend=?" if backend is not None else ""),
                (backend,) if backend is not None else (),
            ).fetchall()
        return {(r["backend"], r["host"]): (r["at"], r["error"]) for r in rows}

    def forget_hosts(self, backend: str | None = None, host: str | None = None) -> int:
        """Ask those hosts again (all, a backend's, or one); returns how many were forgotten."""
        where, args = [], []
        for column, value in (("backend", backend), ("host", host)):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        with self._write() as db:
            done = db.execute(
                "DELETE FROM failed_hosts" + (" WHERE " + " AND ".join(where) if where else ""),
                args,
            )
            return done.rowcount

    def note_user(self, session_id: str, owner: str, at: float) -> None:
        """Process `owner` (see owner_id) took up the session at `at` (`%gpu use`): kept in
        resource["users"], owner -> when, so a face can follow the session a notebook uses."""
        with self._write() as db:
            row = db.execute("SELECT resource FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise UnknownSession(f"no session with id {session_id}")
            resource = json.loads(row["resource"])
            resource["users"] = dict(resource.get("users") or {}, **{owner: at})
            db.execute(
                "UPDATE sessions SET resource=? WHERE id=?", (json.dumps(resource), session_id)
            )

    def set_price(self, session_id: str, price_per_hour: float, detail: str) -> SessionRecord:
        """The price actually paid turned out different from the estimate (a spot fallback)."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
                raise UnknownSession(f"no session with id {session_id}")
            db.execute(
                "UPDATE sessions SET price_per_hour=?, updated_at=? WHERE id=?",
                (price_per_hour, now(), session_id),
            )
            db.execute(
                "INSERT INTO events (session_id, state, at, detail) SELECT id, state, ?, ? FROM sessions WHERE id=?",
                (now(), detail, session_id),
            )
            return self._by_id(db, session_id)

    def retype(
        self, session_id: str, spec: LaunchSpec, price_per_hour: float, detail: str
    ) -> SessionRecord:
        """A fallback list's start moves on to its next type (session/fallback.py): the record's
        spec and price become that type's, and the event says why."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
                raise UnknownSession(f"no session with id {session_id}")
            db.execute(
                "UPDATE sessions SET spec=?, price_per_hour=?, updated_at=? WHERE id=?",
                (json.dumps(spec.to_dict()), price_per_hour, now(), session_id),
            )
            db.execute(
                "INSERT INTO events (session_id, state, at, detail) SELECT id, state, ?, ? FROM sessions WHERE id=?",
                (now(), detail, session_id),
            )
            return self._by_id(db, session_id)

    def respec(self, session_id: str, spec: LaunchSpec) -> SessionRecord:
        """Its backend chose where, within what the user asked (`Backend.place`: a pool's box):
        the record's spec says it."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM sessions WHERE id=?", (session_id,)).fetchone() is None:
                raise UnknownSession(f"no session with id {session_id}")
            db.execute(
                "UPDATE sessions SET spec=?, updated_at=? WHERE id=?",
                (json.dumps(spec.to_dict()), now(), session_id),
            )
            return self._by_id(db, session_id)

    def note(self, session_id: str, detail: str) -> None:
        """Record an event without changing state (a warning, a keepalive, a reconnect)."""
        with self._write() as db:
            row = db.execute("SELECT state FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                raise UnknownSession(f"no session with id {session_id}")
            db.execute(
                "INSERT INTO events (session_id, state, at, detail) VALUES (?,?,?,?)",
                (session_id, row["state"], now(), detail),
            )

    # -- reads --------------------------------------------------------------------------

    def taken_by(self, owner: str) -> tuple[SessionRecord, float] | None:
        """The active session process `owner` was last connected to (`%gpu use`, a switch it
        followed, or the sidebar: `note_user`), with when; None when it has none. A session the
        process merely created (its record's owner) is no connection: a start the magics made
        is theirs already, and one made another way (a record written directly, a start cut
        short) is never waited for by the next `%%gpu` cell."""
        best: tuple[SessionRecord, float] | None = None
        for record in self.list(active_only=True):
            at = (record.resource.get("users") or {}).get(owner)
            if at is not None and (best is None or at > best[1]):
                best = (record, at)
        return best

    def _record(self, db: sqlite3.Connection, row: sqlite3.Row) -> SessionRecord:
        events = [
            Event(session_id=row["id"], state=State(e["state"]), at=e["at"], detail=e["detail"])
            for e in db.execute(
                "SELECT state, at, detail FROM events WHERE session_id=? ORDER BY seq", (row["id"],)
            )
        ]
        return SessionRecord(
            id=row["id"],
            name=row["name"],
            spec=LaunchSpec.from_dict(json.loads(row["spec"])),
            state=State(row["state"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            owner=row["owner"],
            price_per_hour=row["price_per_hour"],
            resource=json.loads(row["resource"]),
            error=row["error"],
            events=events,
        )

    def _by_id(self, db: sqlite3.Connection, session_id: str) -> SessionRecord:
        """The record as a write left it, read in that write's own transaction and connection
        (a connection less than `get` after it: a start writes some twenty records)."""
        row = db.execute("SELECT * FROM sessions WHERE id=?", (session_id,)).fetchone()
        if row is None:
            raise UnknownSession(f"no session with id {session_id}")
        return self._record(db, row)

    def get(self, key: str) -> SessionRecord:
        """By id, name or id prefix (8+ chars): exactly one record, else UnknownSession (several
        ended records of one name, from a store older than unique names: their ids are named)."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM sessions WHERE id=?", (key,)).fetchone()
            if row is None:
                row = self._by_name(db, key)
            if (
                row is None and len(key) >= 8 and set(key) <= _HEX
            ):  # an id's start; never a LIKE pattern (% or _)
                rows = db.execute("SELECT * FROM sessions WHERE id LIKE ?", (key + "%",)).fetchall()
                row = rows[0] if len(rows) == 1 else None
            if row is None:
                active = db.execute(
                    "SELECT name, state FROM sessions WHERE state NOT IN ('stopped','failed')"
                    " ORDER BY created_at DESC"
                ).fetchall()
                raise UnknownSession(
                    f"no session named {key!r}",
                    key=key,
                    active=[(r["name"], r["state"]) for r in active],
                )
            return self._record(db, row)

    @staticmethod
    def _by_name(db: sqlite3.Connection, name: str) -> sqlite3.Row | None:
        rows = db.execute(
            "SELECT * FROM sessions WHERE name=? ORDER BY (state IN ('stopped','failed')), "
            "created_at DESC",
            (name,),
        ).fetchall()
        if len(rows) <= 1 or rows[0]["state"] not in ("stopped", "failed"):
            return rows[0] if rows else None  # the active one holds the name
        ids = ", ".join(f"{r['id'][:8]} ({r['state']})" for r in rows)
        raise UnknownSession(
            f"{len(rows)} ended sessions are named {name!r} (from before names were kept unique): "
            f"name one by its id: {ids}"
        )

    def hand_name_over(self, old_id: str, new_id: str) -> SessionRecord:
        """A switch's successor takes its session's name (the user's session, on other capacity):
        the old record keeps its history under a retired name (`t4-3~1`). The new record back."""
        with self._write() as db:
            taken = {r[0] for r in db.execute("SELECT name FROM sessions")}
            name = db.execute("SELECT name FROM sessions WHERE id=?", (old_id,)).fetchone()[0]
            row = db.execute("SELECT spec FROM sessions WHERE id=?", (new_id,)).fetchone()
            spec = json.loads(row["spec"])
            spec["name"] = name
            db.execute(
                "UPDATE sessions SET name=? WHERE id=?", (_retired_name(name, taken), old_id)
            )
            db.execute(
                "UPDATE sessions SET name=?, spec=?, updated_at=? WHERE id=?",
                (name, json.dumps(spec), now(), new_id),
            )
            return self._by_id(db, new_id)

    def list(self, *, active_only: bool = False, limit: int | None = None) -> list[SessionRecord]:
        q = "SELECT * FROM sessions"
        if active_only:
            q += " WHERE state NOT IN ('stopped','failed')"
        q += " ORDER BY created_at DESC"
        if limit:
            q += f" LIMIT {int(limit)}"
        with self._connect() as db:
            return [self._record(db, r) for r in db.execute(q).fetchall()]
