"""Assembles the service from settings: database, lanes, embedders, LLM, pipeline, workers, the app."""

from __future__ import annotations

import contextlib
import fcntl
import os

from smem.api import create_app
from smem.config import Settings
from smem.console import console_routes
from smem.db import DB
from smem.embed import MiniLMEmbedder, make_embedder
from smem.haproxy import Syncer, WorkerDrain
from smem.ingest import Pipeline
from smem.lanes import LaneChat, LaneEmbedder, LaneReranker, Lanes
from smem.leases import Leases
from smem.llm import LLMExtractor, LLMJudge
from smem.mcp_server import mcp_routes
from smem.metrics import Metrics
from smem.ops import Ops
from smem.workers import Supervisor


class Busy(RuntimeError):
    pass


def embedder_identity(settings: Settings) -> tuple[str, int]:
    """What the database's vectors are made by, without loading the model."""
    if settings.lanes:
        m = settings.model("embed")
        return "http:%s" % m["name"], int(m["dim"])
    e = settings.embedder
    if e.get("kind", "local") == "local":
        return MiniLMEmbedder.name, MiniLMEmbedder.dim
    return "http:%s" % e["model"], int(e["dim"])


_USERS: dict[str, int] = {}   # db path -> the descriptor holding its users' lock (for this process's life)


def hold_open(db_path: str) -> None:
    """Every process that opens the file (smem serve, smem mcp, the tools) holds DB.users shared for its
    life: smem restore takes it exclusive, so it refuses while any of them runs, and they refuse to open
    the file while a restore swaps it."""
    if db_path == ":memory:" or db_path in _USERS:
        return
    fd = lock_file(db_path, ".users")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy("a restore of %s is running" % db_path) from None
    _USERS[db_path] = fd


def let_go(db_path: str) -> None:
    """This process's users' lock on the file, released (tests; a process's exit releases it anyway)."""
    fd = _USERS.pop(db_path, None)
    if fd is not None:
        os.close(fd)


def take_users(db_path: str) -> int:
    """DB.users exclusive, for a restore: Busy while any process has the file open."""
    return _exclusive(db_path, ".users", "a process has %s open (smem serve, smem mcp or a tool)" % db_path)


def _exclusive(db_path: str, suffix: str, busy: str) -> int:
    """The descriptor of DB<suffix>, locked exclusive; Busy(busy) if another holds it."""
    fd = lock_file(db_path, suffix)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy(busy) from None
    return fd


def open_db(path: str, settings: Settings, check_embedder: bool = True) -> DB:
    """check_embedder False (token and backup tools, which read no vectors): an existing file opens
    whatever its embedder; a new one is made with the configured one."""
    hold_open(path)
    if not check_embedder and os.path.exists(path):
        return DB(path, None, None, settings.synchronous, settings.coarse_oversample,
                  bit_cache_mb=settings.bit_cache_mb)
    return DB(path, *embedder_identity(settings), settings.synchronous, settings.coarse_oversample,
              bit_cache_mb=settings.bit_cache_mb)


def lock_file(db_path: str, suffix: str) -> int:
    """The descriptor of DB<suffix>, made 0600 if new. Made by root (a role's token task, a restore), it is
    handed to the database's owner (else its directory's), as SQLite does with -wal and -shm: the service,
    which runs as that user, must open it too."""
    path = db_path + suffix
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    if os.geteuid() == 0:
        owner = os.stat(db_path if os.path.exists(db_path) else os.path.dirname(os.path.abspath(db_path)))
        if os.fstat(fd).st_uid != owner.st_uid:
            os.fchown(fd, owner.st_uid, owner.st_gid)
    return fd


def take_lock(db_path: str):
    """One server per database file: then a job left 'running' at start was a dead process's."""
    return _exclusive(db_path, ".lock", "another smem serve holds %s" % db_path)


def build(db_path: str, settings: Settings, embedder=None, start_workers: bool = True):
    """(app, pipeline). With start_workers the app's lifespan requeues orphaned jobs and runs the workers.
    embedder (tests): used for search and ingest instead of the configured one."""
    db = open_db(db_path, settings)
    lanes = Lanes(settings)
    leases = Leases(db, lanes)  # live leases from the file: a restart honours them
    worker_drain = None
    if settings.haproxy_socket:   # leased nodes out of the LLM workers' HAProxy too
        worker_drain = WorkerDrain(db, settings.haproxy_socket, settings.haproxy_backend, leases.live_nodes)
        leases.on_change = worker_drain.reconcile
    extractor = judge = reranker = None
    if settings.lanes:
        embed = settings.model("embed")
        search_embedder = embedder or LaneEmbedder(lanes, embed, "interactive")
        # Ingest may borrow the interactive lane for embeddings, never for chat.
        ingest_embedder = embedder or LaneEmbedder(lanes, embed, "background", fallback="interactive")
        if settings.model("chat"):
            chat = LaneChat(lanes, settings.model("chat"), settings.llm_max_tokens)
            extractor = LLMExtractor(chat, settings.llm_retries)
            judge = LLMJudge(chat, settings.llm_retries)
        if settings.model("rerank"):
            reranker = LaneReranker(lanes, settings.model("rerank"))
    else:
        search_embedder = ingest_embedder = embedder or make_embedder(settings.embedder)
    pipeline = Pipeline(db, ingest_embedder, settings, extractor=extractor, judge=judge)
    metrics = Metrics()
    supervisor = Supervisor(pipeline, settings.workers, on_done=metrics.job_done) if start_workers else None
    ops = Ops(db, settings, pipeline, search_embedder, reranker=reranker, leases=leases, lanes=lanes,
              supervisor=supervisor, metrics=metrics)
    mcp, mcp_running = mcp_routes(ops)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        workers = []
        if worker_drain:
            worker_drain.reconcile()   # what changed while smem was down
            workers.append(Syncer(worker_drain, settings.haproxy_sync_s))
            workers[-1].start()
        if supervisor:
            pipeline.requeue_orphans()
            supervisor.start()
        async with mcp_running():
            yield
        if supervisor:
            supervisor.stop()
        for w in workers:
            w.stop()
        for w in workers:
            w.join(timeout=30)
        db.close()   # the last connection checkpoints: a clean stop leaves no WAL behind

    app = create_app(db, search_embedder, settings, pipeline, lifespan=lifespan, lanes=lanes, leases=leases,
                     reranker=reranker, extra_routes=[*mcp, *console_routes()], ops=ops)
    # `smem mcp` (stdio) searches as the HTTP API does: the interactive lane and its reranker.
    app.state.search_embedder, app.state.reranker = search_embedder, reranker
    return app, pipeline
