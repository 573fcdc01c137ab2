"""A lease takes its nodes out of HAProxy too, where the host's LLM workers (roles/llm_workers) share
them with smem's lanes: the node's server in the workers' backend is drained (the requests in flight
finish) and set ready again when the lease ends. Only what smem drained is returned, kept in the
database (worker_drains), so a restarted smem still returns it and a worker an operator drained by
hand stays drained. reconcile() brings HAProxy to the leases as they are now: on a lease's start and
end, and every haproxy_sync_s for leases that expired and commands that failed."""

from __future__ import annotations

import logging
import socket
import threading

from smem.db import DB, now

LOG = logging.getLogger("smem.haproxy")


class HAProxyError(RuntimeError):
    pass


def command(socket_path: str, line: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's admin socket; its answer (empty when it went through)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        s.sendall(line.encode() + b"\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data.decode().strip()


class WorkerDrain:
    def __init__(self, db: DB, socket_path: str, backend: str, lease_nodes):
        """lease_nodes(): the nodes of the live leases, now."""
        self.db, self.socket_path, self.backend, self.lease_nodes = db, socket_path, backend, lease_nodes
        self.lock = threading.Lock()

    def _set(self, node: str, state: str) -> bool:
        """True when HAProxy took it; False when the backend has no such server (the node runs no worker)."""
        answer = command(self.socket_path, "set server %s/%s state %s" % (self.backend, node, state))
        if not answer:
            return True
        if answer.startswith(("No such server", "No such backend")):
            return False
        raise HAProxyError("HAProxy refused 'set server %s/%s state %s': %s" % (self.backend, node, state, answer))

    def drained(self) -> set[str]:
        return {r["node"] for r in self.db.rows("SELECT node FROM worker_drains")}

    def reconcile(self) -> None:
        """Drain the leased nodes' workers that smem has not drained yet, return the ones whose lease
        ended. A failure is logged and left for the next call; nothing is recorded that did not happen."""
        with self.lock:
            leased, drained = set(self.lease_nodes()), self.drained()
            for node in sorted(leased - drained):
                try:
                    if self._set(node, "drain"):
                        with self.db.tx() as c:
                            c.execute("INSERT OR IGNORE INTO worker_drains VALUES (?, ?)", (node, now()))
                except (OSError, HAProxyError) as e:
                    LOG.warning("could not drain %s's LLM worker in HAProxy (%s): will try again", node, e)
            for node in sorted(drained - leased):
                try:
                    self._set(node, "ready")   # gone from the backend: nothing to return
                    with self.db.tx() as c:
                        c.execute("DELETE FROM worker_drains WHERE node = ?", (node,))
                except (OSError, HAProxyError) as e:
                    LOG.warning("could not return %s's LLM worker in HAProxy (%s): will try again", node, e)


class Syncer(threading.Thread):
    """reconcile() every interval seconds until stop()."""

    def __init__(self, drain: WorkerDrain, interval: float):
        super().__init__(name="haproxy-sync", daemon=True)
        self.drain, self.interval, self.stopping = drain, interval, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                self.drain.reconcile()
            except Exception:   # the database busy past its timeout, say: the next round tries again
                LOG.exception("haproxy sync failed")

    def stop(self) -> None:
        self.stopping.set()
