"""The coarse KNN pass in memory: each namespace's sign bits (smem.vectors) as a numpy array, scanned with XOR
and popcount, instead of sqlite-vec's scan of its bit table (1M vectors: ~10 ms of CPU against ~500).

What makes the copy right whichever process wrote the file: every change of a bit table is logged in the
same transaction (vectors.insert/delete: vector_log, one row a change, with its seq). A query reads the log's
head in the read transaction it rescores in; a namespace's copy behind it applies the changes since (or is
loaded again when the log no longer holds them), so the candidates are those of the very snapshot the exact
pass reads. A copy is changed only from a read transaction this module opened (it holds no one's
uncommitted writes); inside someone's write transaction a copy that is behind is not used (None: the
caller scans the bit table in SQL). The file's epoch (meta vectors_epoch, new at each restore) tells a
copy of another file's vectors.

Memory is bounded: at most max_bytes for all namespaces held, least recently used dropped first; a namespace
that alone would not fit is not held (None)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np

TAIL_MAX = 4096          # rows appended out of rowid order before the copy is sorted again
DEAD_MIN = 4096          # deleted rows kept as dead slots before the copy is compacted (or a quarter of it)
TOO_BIG_RECHECK_S = 60.0
FAR = np.iinfo(np.uint16).max

HEAD = ("SELECT (SELECT value FROM meta WHERE key = 'vectors_epoch'), (SELECT max(seq) FROM vector_log),"
        " (SELECT min(seq) FROM vector_log)")
CHANGES = ("SELECT item, bits FROM vector_log WHERE seq > ? AND seq <= ? AND kind = ? AND ns = ? ORDER BY seq")
# sqlite-vec 0.1's own tables behind a vec0 table (a chunk: its slots' validity bits, rowids and vectors).
# Their join is written v.rowid = +c.chunk_id: vector_chunks00's key column is untyped, and compared with an
# INTEGER column its index goes unused (the join then reads every vector chunk once per chunk).
CHUNK_COLUMNS = ["chunk_id", "size", "sequence_id", "partition00", "validity", "rowids"]
VECTOR_COLUMNS = ["rowid", "vectors"]


class LayoutError(RuntimeError):
    """sqlite-vec's tables are not laid out as this module reads them (another version)."""


def words(blob: bytes, width: int) -> np.ndarray:
    """A bit vector as `width` uint64 words, zero-padded."""
    b = np.zeros(width * 8, np.uint8)
    b[:len(blob)] = np.frombuffer(blob, np.uint8)
    return b.view(np.uint64)


class Held:
    """One namespace's bit vectors of one kind: columns of words (width x capacity, a column a vector) and
    their rowids. Rows [0, s) are sorted by rowid (no duplicates); rows appended since may be out of order.
    A deleted row stays as a dead slot until the copy is compacted."""

    def __init__(self, rowids: np.ndarray, cols: np.ndarray, seq: int, epoch: str):
        order = np.argsort(rowids, kind="stable")
        self.width = cols.shape[0]
        self.seq, self.epoch = seq, epoch
        self.lock = threading.Lock()
        self._set(rowids[order], cols[:, order])

    def _set(self, rowids: np.ndarray, cols: np.ndarray) -> None:
        n = len(rowids)
        cap = max(64, n + n // 4)
        self.rowids = np.zeros(cap, np.int64)
        self.rowids[:n] = rowids
        self.cols = np.zeros((self.width, cap), np.uint64)
        self.cols[:, :n] = cols
        self.dead = np.zeros(cap, bool)
        self.n = self.s = n
        self.n_dead = 0

    @property
    def nbytes(self) -> int:
        return self.rowids.nbytes + self.cols.nbytes + self.dead.nbytes

    def rows(self) -> int:
        return self.n - self.n_dead

    def _find(self, rowid: int) -> int | None:
        """The live slot of rowid, if held."""
        i = int(np.searchsorted(self.rowids[:self.s], rowid))
        if i < self.s and self.rowids[i] == rowid and not self.dead[i]:
            return i
        tail = np.flatnonzero((self.rowids[self.s:self.n] == rowid) & ~self.dead[self.s:self.n])
        return self.s + int(tail[0]) if len(tail) else None

    def add(self, rowid: int, bits: bytes) -> None:
        if self.n == len(self.rowids):
            cap = 2 * self.n
            self.rowids = np.concatenate([self.rowids, np.zeros(cap - self.n, np.int64)])
            self.cols = np.concatenate([self.cols, np.zeros((self.width, cap - self.n), np.uint64)], axis=1)
            self.dead = np.concatenate([self.dead, np.zeros(cap - self.n, bool)])
        old = self._find(rowid)   # sqlite-vec keeps a rowid once: a second insert is a replacement
        if old is not None:
            self.cols[:, old] = words(bits, self.width)
            return
        n = self.n
        self.rowids[n] = rowid
        self.cols[:, n] = words(bits, self.width)
        self.dead[n] = False
        if self.s == n and (n == 0 or self.rowids[n - 1] < rowid):
            self.s += 1
        self.n += 1
        if self.n - self.s > TAIL_MAX:
            self.compact()

    def remove(self, rowid: int) -> None:
        i = self._find(rowid)
        if i is not None:
            self.dead[i] = True
            self.n_dead += 1
            if self.n_dead > max(DEAD_MIN, self.n // 4):
                self.compact()

    def compact(self) -> None:
        """Sorted again, without the dead slots."""
        live = ~self.dead[:self.n]
        rowids, cols = self.rowids[:self.n][live], self.cols[:, :self.n][:, live]
        order = np.argsort(rowids, kind="stable")
        self._set(rowids[order], cols[:, order])

    def nearest(self, query: np.ndarray, m: int) -> np.ndarray:
        """The rowids of the m live rows nearest to query (its words) by Hamming distance, in no order."""
        n = self.n
        if n == 0 or m <= 0:
            return np.zeros(0, np.int64)
        dist = np.zeros(n, np.uint16)
        x = np.empty(n, np.uint64)
        ones = np.empty(n, np.uint8)
        for j in range(self.width):   # a column at a time: each pass reads one contiguous row of words
            np.bitwise_xor(self.cols[j, :n], query[j], out=x)
            np.bitwise_count(x, out=ones)
            np.add(dist, ones, out=dist)
        if self.n_dead:
            dist[self.dead[:n]] = FAR
        m = min(m, n - self.n_dead)
        pick = np.argpartition(dist, m - 1)[:m] if m < n else np.flatnonzero(~self.dead[:n])
        return self.rowids[pick]


class BitCache:
    """The held namespaces of one process's file, for every thread (each query locks its namespace's copy)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._held: OrderedDict[tuple[str, str], Held] = OrderedDict()   # least recently used first
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._too_big: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.loads = 0   # how many times a namespace was read whole (tests, the bench)

    def nearest(self, c, *, clean: bool, kind: str, table: str, ns: str, query_bits: bytes,
                m: int) -> list[int] | None:
        """The rowids of the namespace's m nearest bit vectors of table (a vec0 bit table) to query_bits, as
        of c's read transaction; clean: that transaction is one the caller opened to read (it holds no
        uncommitted writes of its own). None: not held (too big, or behind inside a write transaction, or
        sqlite-vec's layout unknown): scan the table in SQL."""
        epoch, head, first = c.execute(HEAD).fetchone()
        head = head or 0
        key = (kind, ns)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            held = self._get(key)
            if held is not None and held.epoch != epoch:
                held = self._drop(key)
            if held is not None and held.seq < head:
                if not clean:
                    return None
                if first is not None and first <= held.seq + 1:
                    for item, bits in c.execute(CHANGES, (held.seq, head, kind, ns)):
                        if bits is None:
                            held.remove(item)
                        else:
                            held.add(item, bits)
                    held.seq = head
                    self._account()
                    if key not in self._held:   # grown past the bound
                        return None
                else:   # the log no longer holds the changes since this copy: read it again
                    held = self._drop(key)
            if held is None:
                if not clean or self.max_bytes <= 0:
                    return None
                held = self._load(c, key, table, head, epoch, len(query_bits))
                if held is None:
                    return None
            return held.nearest(words(query_bits, held.width), m).tolist()

    def _get(self, key) -> Held | None:
        with self._lock:
            held = self._held.get(key)
            if held is not None:
                self._held.move_to_end(key)
            return held

    def _drop(self, key) -> None:
        with self._lock:
            self._held.pop(key, None)

    def _account(self) -> None:
        """Least recently used namespaces out until the rest fit; one that alone does not fit, out too."""
        with self._lock:
            total = sum(h.nbytes for h in self._held.values())
            while self._held and total > self.max_bytes:
                total -= self._held.popitem(last=False)[1].nbytes

    def _load(self, c, key, table: str, head: int, epoch: str, vec_bytes: int) -> Held | None:  # noqa: PLR0917
        with self._lock:
            since = self._too_big.get(key)
        if since is not None and time.monotonic() - since < TOO_BIG_RECHECK_S:
            return None
        ns = key[1]
        try:
            slots, size = _shape(c, table, ns, vec_bytes)
            width = -(-vec_bytes // 8)
            if slots * (8 * width + 9) * 5 // 4 > self.max_bytes:
                with self._lock:
                    self._too_big[key] = time.monotonic()
                return None
            rowids, cols = _read(c, table, ns, size=size, vec_bytes=vec_bytes, width=width)
        except LayoutError:
            return None
        held = Held(rowids, cols, head, epoch)
        self.loads += 1
        with self._lock:
            self._too_big.pop(key, None)
            self._held[key] = held
        self._account()
        return held if key in self._held else None

    def held_rows(self, kind: str, ns: str) -> int | None:
        h = self._held.get((kind, ns))
        return None if h is None else h.rows()


def _columns(c, table: str) -> list[str]:
    return [r[1] for r in c.execute("PRAGMA table_info(%s)" % table)]


def _shape(c, table: str, ns: str, vec_bytes: int) -> tuple[int, int]:
    """(slots the namespace's chunks hold, slots a chunk), the layout checked (vec_bytes a vector)."""
    if (_columns(c, table + "_chunks") != CHUNK_COLUMNS
            or _columns(c, table + "_vector_chunks00") != VECTOR_COLUMNS):
        raise LayoutError(table)
    row = c.execute("SELECT count(*), max(length(c.rowids)), min(length(c.rowids)), max(length(v.vectors)),"
                    " min(length(v.vectors)) FROM %s_chunks c CROSS JOIN %s_vector_chunks00 v ON v.rowid = +c.chunk_id"
                    " WHERE c.partition00 = ?" % (table, table), (ns,)).fetchone()
    chunks, rid_max, rid_min, vec_max, vec_min = row
    if not chunks:
        return 0, 1
    if rid_max != rid_min or vec_max != vec_min or rid_max % 8 or vec_max != rid_max // 8 * vec_bytes:
        raise LayoutError(table)
    size = rid_max // 8
    return chunks * size, size


def _read(c, table: str, ns: str, *, size: int, vec_bytes: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rows = c.execute("SELECT c.validity, c.rowids, v.vectors FROM %s_chunks c CROSS JOIN %s_vector_chunks00 v"
                     " ON v.rowid = +c.chunk_id WHERE c.partition00 = ?" % (table, table), (ns,)).fetchall()
    if not rows:
        return np.zeros(0, np.int64), np.zeros((width, 0), np.uint64)
    vbytes = len(rows[0][0])
    if vbytes * 8 < size or any(len(v) != vbytes or len(r) != 8 * size or len(b) != size * vec_bytes
                                for v, r, b in rows):
        raise LayoutError(table)
    # One array each for all the chunks (a chunk at a time is ~30 us each, 0.5 s at a million vectors).
    valid = np.unpackbits(np.frombuffer(b"".join(r[0] for r in rows), np.uint8), bitorder="little")
    live = valid.reshape(len(rows), 8 * vbytes)[:, :size].reshape(-1).astype(bool)
    rowids = np.frombuffer(b"".join(r[1] for r in rows), np.int64)[live]
    b = np.zeros((len(rowids), 8 * width), np.uint8)
    b[:, :vec_bytes] = np.frombuffer(b"".join(r[2] for r in rows), np.uint8).reshape(-1, vec_bytes)[live]
    return rowids, np.ascontiguousarray(b.view(np.uint64).T)
