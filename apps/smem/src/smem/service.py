"""Assembles the service from settings: database, embedder, pipeline, workers, the app."""

from __future__ import annotations

import contextlib
import fcntl
import os

from smem.api import create_app
from smem.config import Settings
from smem.db import DB
from smem.embed import MiniLMEmbedder, make_embedder
from smem.ingest import Pipeline, Worker


class Busy(RuntimeError):
    pass


def embedder_identity(settings: Settings) -> tuple[str, int]:
    """What the database's vectors are made by, without loading the model."""
    e = settings.embedder
    if e.get("kind", "local") == "local":
        return MiniLMEmbedder.name, MiniLMEmbedder.dim
    return "http:%s" % e["model"], int(e["dim"])


def open_db(path: str, settings: Settings) -> DB:
    return DB(path, *embedder_identity(settings))


def take_lock(db_path: str):
    """One server per database file: then a job left 'running' at start was a dead process's."""
    fd = os.open(db_path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Busy("another smem serve holds %s" % db_path) from None
    return fd


def build(db_path: str, settings: Settings, embedder=None, start_workers: bool = True):
    """(app, pipeline). With start_workers the app's lifespan requeues orphaned jobs and runs the workers."""
    if settings.llm:
        raise ValueError("llm: extraction through llama-server is not in this version; remove the [llm] setting")
    if settings.reranker:
        raise ValueError("reranker: not in this version; remove the [reranker] setting")
    embedder = embedder or make_embedder(settings.embedder)
    db = open_db(db_path, settings)
    pipeline = Pipeline(db, embedder, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        workers = []
        if start_workers:
            pipeline.requeue_orphans()
            workers = [Worker(pipeline, "worker-%d" % i) for i in range(settings.workers)]
            for w in workers:
                w.start()
        yield
        for w in workers:
            w.stop()
        for w in workers:
            w.join(timeout=30)

    return create_app(db, embedder, settings, pipeline, lifespan=lifespan), pipeline
