"""The one SQLite file: WAL, versioned schema, FTS5 and sqlite-vec (through apsw, which can load extensions)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import threading
from contextlib import contextmanager
from datetime import UTC, datetime

import apsw
import numpy as np
import sqlite_vec

from smem import vectors
from smem.bit_cache import BitCache

TIME_FMT = "%Y-%m-%dT%H:%M:%S.%fZ"  # fixed width, so text order is time order


def now() -> str:
    return datetime.now(UTC).strftime(TIME_FMT)


def parse_time(value: str) -> str:
    """ISO-8601 in (a date, or a time with or without offset; naive means UTC) -> the stored form."""
    if not isinstance(value, str) or not value:
        raise ValueError("expected an ISO-8601 date or time, got %r" % (value,))
    t = datetime.fromisoformat(value)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.astimezone(UTC).strftime(TIME_FMT)


def new_id(prefix: str) -> str:
    return "%s_%s" % (prefix, secrets.token_hex(8))


def vec_blob(v: np.ndarray) -> bytes:
    return np.asarray(v, dtype=np.float32).tobytes()


class SchemaError(RuntimeError):
    pass


def _m1(c: apsw.Connection, dim: int) -> None:
    c.execute("""
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE documents(
        id TEXT PRIMARY KEY, ns TEXT NOT NULL, custom_id TEXT, content TEXT NOT NULL,
        metadata TEXT NOT NULL DEFAULT '{}', valid_at TEXT,
        status TEXT NOT NULL CHECK (status IN ('queued','extracting','indexing','done','failed')),
        error TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE INDEX documents_ns ON documents(ns, created_at);
    CREATE TABLE chunks(
        rowid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, ns TEXT NOT NULL,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL, content TEXT NOT NULL, tokens INTEGER NOT NULL,
        embedding BLOB, indexed INTEGER NOT NULL DEFAULT 0, UNIQUE (document_id, seq));
    CREATE TABLE memories(
        rowid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, ns TEXT NOT NULL, content TEXT NOT NULL,
        valid_from TEXT NOT NULL, valid_to TEXT,         -- the world's time
        recorded_at TEXT NOT NULL, expired_at TEXT,      -- smem's time
        supersedes TEXT, forgotten_at TEXT,
        origin TEXT NOT NULL CHECK (origin IN ('user','extracted')),
        document_id TEXT, source_chunk_id TEXT, model TEXT, prompt_hash TEXT,
        embedding BLOB, indexed INTEGER NOT NULL DEFAULT 0, metadata TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX memories_ns ON memories(ns, valid_from);
    CREATE TABLE history(
        id INTEGER PRIMARY KEY, ns TEXT NOT NULL, memory_id TEXT NOT NULL,
        event TEXT NOT NULL, other_id TEXT, at TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '{}');
    CREATE INDEX history_memory ON history(memory_id);
    CREATE TABLE jobs(
        id INTEGER PRIMARY KEY, ns TEXT NOT NULL,
        document_id TEXT NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
        stage TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN ('queued','running','done','failed')),
        attempts INTEGER NOT NULL DEFAULT 0, owner TEXT, run_after TEXT NOT NULL,
        stages TEXT NOT NULL DEFAULT '{}', error TEXT, created_at TEXT NOT NULL, updated_at TEXT NOT NULL);
    CREATE INDEX jobs_claim ON jobs(state, run_after);
    CREATE TABLE tokens(
        id TEXT PRIMARY KEY, hash TEXT UNIQUE NOT NULL, namespaces TEXT NOT NULL,
        admin INTEGER NOT NULL DEFAULT 0, label TEXT, created_at TEXT NOT NULL, revoked_at TEXT);
    CREATE TABLE leases(
        id TEXT PRIMARY KEY, holder TEXT NOT NULL, nodes TEXT NOT NULL,
        created_at TEXT NOT NULL, expires_at TEXT NOT NULL, released_at TEXT);
    CREATE VIRTUAL TABLE chunks_fts USING fts5(content, ns UNINDEXED, tokenize='porter unicode61');
    CREATE VIRTUAL TABLE memories_fts USING fts5(content, ns UNINDEXED, tokenize='porter unicode61');
    """)
    # Partition keys: a KNN query names one namespace and sqlite-vec scans only that partition.
    for table in ("vec_chunks", "vec_memories"):
        c.execute("CREATE VIRTUAL TABLE %s USING vec0(ns text partition key,"
                  " embedding float[%d] distance_metric=cosine)" % (table, dim))


def _m2(c: apsw.Connection, dim: int) -> None:
    # customId is the caller's key: a second POST with it replaces the document.
    c.execute("CREATE UNIQUE INDEX documents_custom_id ON documents(ns, custom_id) WHERE custom_id IS NOT NULL")


def _m3(c: apsw.Connection, dim: int) -> None:
    # The judge's "extends": the fact this one adds detail to (both stay current).
    c.execute("ALTER TABLE memories ADD COLUMN extends TEXT")


def _m4(c: apsw.Connection, dim: int) -> None:
    # The nodes whose LLM worker smem drained in HAProxy for a lease (smem.haproxy): only these are
    # returned when their lease ends, so a worker an operator drained by hand stays drained.
    c.execute("CREATE TABLE worker_drains(node TEXT PRIMARY KEY, drained_at TEXT NOT NULL)")


def _m5(c: apsw.Connection, dim: int) -> None:
    # Token scopes (read, write, lease); an erased fact keeps its row as a tombstone (no content).
    c.execute("ALTER TABLE tokens ADD COLUMN scopes TEXT NOT NULL DEFAULT '[\"read\",\"write\"]'")
    c.execute("ALTER TABLE memories ADD COLUMN erased_at TEXT")
    c.execute("CREATE INDEX memories_document ON memories(document_id)")
    c.execute("CREATE INDEX jobs_updated ON jobs(updated_at)")   # /healthz: when a job last moved
    # A deleted FTS5 row leaves its terms in the index until a merge; secure-delete removes them at once.
    for table in ("chunks_fts", "memories_fts"):
        c.execute("INSERT INTO %s(%s, rank) VALUES ('secure-delete', 1)" % (table, table))


VEC_CHUNK_SIZE = 64   # vectors sqlite-vec reserves at a time per namespace (its default, 1024, is 1.5 MB each)


def content_key(content: str) -> str:
    """The key two facts share when their text is the same but for case and spacing (text.normalise)."""
    return hashlib.sha256(" ".join(content.lower().split()).encode()).hexdigest()


def _m6(c: apsw.Connection, dim: int) -> None:
    # Lookups that scanned a namespace get an index each: the exact-duplicate check and forget by content
    # (content_key), listing documents, counting a namespace's chunks, a document's job.
    c.execute("ALTER TABLE memories ADD COLUMN content_key TEXT")
    c.create_scalar_function("smem_content_key", content_key, 1, deterministic=True)
    c.execute("UPDATE memories SET content_key = smem_content_key(content) WHERE erased_at IS NULL")
    c.execute("""
    CREATE INDEX memories_key ON memories(ns, content_key) WHERE content_key IS NOT NULL;
    CREATE INDEX memories_state ON memories(ns, indexed, forgotten_at, valid_to, erased_at);
    CREATE INDEX documents_list ON documents(ns, created_at, id);
    CREATE INDEX documents_status ON documents(ns, status, created_at, id);
    CREATE INDEX chunks_ns ON chunks(ns, indexed);
    CREATE INDEX jobs_document ON jobs(document_id);
    CREATE INDEX documents_state ON documents(status);
    """)
    # The vector tables again with a small chunk: sqlite-vec reserved 1,024 vectors for every namespace.
    dim_of = c.execute("SELECT value FROM meta WHERE key='dim'").fetchone()
    dim = int(dim_of[0]) if dim_of else dim
    for table in ("vec_chunks", "vec_memories"):
        c.execute("CREATE TEMP TABLE keep AS SELECT rowid AS r, ns, embedding FROM %s" % table)
        c.execute("DROP TABLE %s" % table)
        c.execute(vec_table_sql(table, dim))
        c.execute("INSERT INTO %s(rowid, ns, embedding) SELECT r, ns, embedding FROM temp.keep" % table)
        c.execute("DROP TABLE temp.keep")


def vec_table_sql(table: str, dim: int) -> str:
    # Partition keys: a KNN query names one namespace and sqlite-vec scans only that partition.
    return ("CREATE VIRTUAL TABLE %s USING vec0(ns text partition key, embedding float[%d] distance_metric=cosine,"
            " chunk_size=%d)" % (table, dim, VEC_CHUNK_SIZE))


def _m7(c: apsw.Connection, dim: int) -> None:
    # A coarse index beside each float vector table (smem.vectors): its bits are filled after this
    # migration, in batches (vectors.fill_bits), so a large file's upgrade holds the write lock briefly.
    dim_of = c.execute("SELECT value FROM meta WHERE key='dim'").fetchone()
    vectors.create_bit_tables(c, int(dim_of[0]) if dim_of else dim, VEC_CHUNK_SIZE)


def _m8(c: apsw.Connection, dim: int) -> None:
    # The bit tables' change log, which keeps each process's copy of them in memory right (smem.bit_cache).
    vectors.create_log(c)


MIGRATIONS = [_m1, _m2, _m3, _m4, _m5, _m6, _m7, _m8]
VERSION = len(MIGRATIONS)


SYNCHRONOUS = ("FULL", "NORMAL")


def connect(path: str, synchronous: str = "FULL") -> apsw.Connection:
    if path != ":memory:" and not os.path.exists(path):
        # SQLite creates the file with the umask's mode, and its -wal and -shm with the file's: 0600.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    c = apsw.Connection(path)
    c.enable_load_extension(True)
    c.load_extension(sqlite_vec.loadable_path())
    c.enable_load_extension(False)
    c.set_busy_timeout(30_000)
    c.execute("PRAGMA journal_mode=WAL")
    # FULL: a transaction is on disk when COMMIT returns, so an answered 202 survives a power cut.
    c.execute("PRAGMA synchronous=%s" % synchronous)
    c.execute("PRAGMA foreign_keys=ON")
    # Deleted content is overwritten, not left in free pages: an erase leaves no copy in the file.
    c.execute("PRAGMA secure_delete=ON")
    return c


def schema_version(c: apsw.Connection) -> int:
    if not c.execute("SELECT 1 FROM sqlite_master WHERE name='schema_version'").fetchall():
        return 0
    row = c.execute("SELECT max(version) FROM schema_version").fetchone()
    return row[0] or 0


def migrate(c: apsw.Connection, embedder_name: str | None, dim: int | None, upto: int = VERSION) -> int:
    """Brings the file to version `upto`, one transaction per migration; returns the version.
    embedder_name None: the file's vectors are not checked (a tool that reads no vectors); a new file
    cannot be made that way."""
    c.execute("BEGIN IMMEDIATE")
    try:
        c.execute("CREATE TABLE IF NOT EXISTS schema_version(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        have = schema_version(c)
        c.execute("COMMIT")
    except BaseException:
        c.execute("ROLLBACK")
        raise
    if have > VERSION:
        raise SchemaError("the database is at schema version %d; this smem knows up to %d" % (have, VERSION))
    for version in range(have + 1, upto + 1):
        c.execute("BEGIN IMMEDIATE")
        try:
            if schema_version(c) >= version:  # another process got there first
                c.execute("ROLLBACK")
                continue
            if version == 1 and embedder_name is None:
                raise SchemaError("a new database needs its embedder: give --config (or the default settings)")
            MIGRATIONS[version - 1](c, dim)
            if version == 1:
                c.execute("INSERT INTO meta VALUES ('embedder', ?), ('dim', ?)", (embedder_name, str(dim)))
            c.execute("INSERT INTO schema_version VALUES (?, ?)", (version, now()))
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
    meta = dict(c.execute("SELECT key, value FROM meta").fetchall())
    if embedder_name is None:
        return schema_version(c)
    if meta.get("embedder") != embedder_name or int(meta.get("dim", 0)) != dim:
        raise SchemaError("the database's vectors come from %s (dim %s), but the embedder configured is %s (dim %d)"
                          % (meta.get("embedder"), meta.get("dim"), embedder_name, dim))
    return schema_version(c)


class DB:
    """One connection per thread onto one file; `tx()` is a write transaction taken up front."""

    def __init__(self, path: str, embedder_name: str | None, dim: int | None, synchronous: str = "FULL",
                 coarse_oversample: int = 8, *, bit_cache_mb: int = 256):
        """coarse_oversample: a KNN query reads this many times its k by the bit vectors, then ranks them
        exactly (smem.vectors); 0: exact KNN on the float vectors. bit_cache_mb: the bit vectors of the
        namespaces queried are held in memory up to this many MiB in all (smem.bit_cache); 0: none."""
        if synchronous not in SYNCHRONOUS:
            raise ValueError("synchronous: one of %s, got %r" % (", ".join(SYNCHRONOUS), synchronous))
        for key, value in (("coarse_oversample", coarse_oversample), ("bit_cache_mb", bit_cache_mb)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError("%s: a whole number >= 0, got %r" % (key, value))
        self.path, self.synchronous, self.coarse_oversample = path, synchronous, coarse_oversample
        self.bit_cache = BitCache(bit_cache_mb * 2**20) if bit_cache_mb else None
        self._bits_ready = False
        self._local = threading.local()
        self._all: list[apsw.Connection] = []
        self._all_lock = threading.Lock()
        self.version = migrate(self.conn, embedder_name, dim)
        if self.version >= 7:
            vectors.fill_bits(self.conn)
        # A connection that changed an FTS5 table's configuration (migration 5) keeps a stale view of
        # it, and its integrity_check then reports a false checksum mismatch: use fresh ones from here.
        self.close()

    @property
    def conn(self) -> apsw.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = connect(self.path, self.synchronous)
            with self._all_lock:
                self._all.append(c)
        return c

    def rows(self, sql: str, params=()) -> list[dict]:
        return list(self.iter(sql, params))

    def iter(self, sql: str, params=()):
        """The rows as dicts, one at a time (a namespace's export does not sit in memory whole)."""
        cur = self.conn.execute(sql, params)
        names = None
        for row in cur:
            names = names or [d[0] for d in cur.get_description()]
            yield dict(zip(names, row, strict=True))

    @contextmanager
    def snapshot(self):
        """A read transaction: every read inside sees one moment of the file, and no writer waits for it
        (WAL: readers and the writer do not block each other)."""
        c = self.conn
        c.execute("BEGIN DEFERRED")
        try:
            c.execute("SELECT 1 FROM meta LIMIT 1").fetchall()   # the snapshot starts at the first read
            yield c
        finally:
            if c.in_transaction:
                c.execute("COMMIT")

    @contextmanager
    def reading(self):
        """(connection, clean): inside the transaction this thread has open, else inside a read transaction
        opened here (clean: it holds no uncommitted write)."""
        c = self.conn
        if c.in_transaction:
            yield c, False
            return
        with self.snapshot() as c:
            yield c, True

    def coarse(self) -> bool:
        """Whether KNN queries go through the bit vectors now (on, and their fill has ended)."""
        if self.coarse_oversample and not self._bits_ready:
            self._bits_ready = vectors.bits_ready(self.conn)
        return bool(self.coarse_oversample) and self._bits_ready

    def one(self, sql: str, params=()) -> dict | None:
        r = self.rows(sql, params)
        return r[0] if r else None

    def scalar(self, sql: str, params=()):
        row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    @contextmanager
    def tx(self):
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
            c.execute("COMMIT")
        except BaseException:
            # SQLite has rolled back already after some errors (SQLITE_FULL, SQLITE_IOERR): a second
            # ROLLBACK would fail and hide the error that matters. A failed COMMIT leaves it open.
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def history(self, c, ns: str, memory_id: str, event: str, other_id: str | None = None, **detail) -> None:
        c.execute("INSERT INTO history(ns, memory_id, event, other_id, at, detail) VALUES (?,?,?,?,?,?)",
                  (ns, memory_id, event, other_id, now(), json.dumps(detail)))

    def checkpoint(self, wait_s: float | None = None) -> tuple[int, int, int]:
        """Copies the WAL into the file and truncates it (busy, frames in the WAL, frames copied):
        after it, what was deleted (and overwritten, secure_delete) is in neither file. busy 1: a reader
        of an older snapshot (or a writer) kept it from finishing within wait_s (default: the busy timeout)."""
        c = self.conn
        if wait_s is not None:
            c.set_busy_timeout(int(wait_s * 1000))
        try:
            return c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except apsw.BusyError:
            return (1, -1, -1)
        finally:
            if wait_s is not None:
                c.set_busy_timeout(30_000)

    def mark_erase(self, c) -> None:
        """When content was last erased: a backup older than this still holds it (smem backup prune --erased)."""
        c.execute("INSERT INTO meta VALUES ('last_erase_at', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                  (now(),))

    def close(self) -> None:
        """Every thread's connection; the last one to close checkpoints the WAL into the file."""
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()
