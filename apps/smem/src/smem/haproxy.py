"""A lease takes its nodes out of HAProxy too, where the host's LLM workers (roles/llm_workers) share
them with smem's lanes: the node's server in the workers' backend is drained (the requests in flight
finish) and set ready again when the lease ends. Only what smem drained is returned, kept in the
database (worker_drains), so a restarted smem still returns it and a worker an operator drained by
hand stays drained. reconcile() brings HAProxy to the leases as they are now, read against what HAProxy
says (`show servers state`), not against smem's own table: a reload that lost the server states, or a
benchmark that set a server ready, would otherwise put a leased node back into chat service for the rest
of its lease. It runs on a lease's start and end, and every haproxy_sync_s."""

from __future__ import annotations

import logging
import socket
import threading

from smem.db import DB, now

LOG = logging.getLogger("smem.haproxy")
# srv_admin_state's bits (HAProxy's SRV_ADMF_*): forced maintenance, forced drain; set over the socket.
FMAINT, FDRAIN = 0x01, 0x08


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

    def admin_states(self) -> dict[str, int]:
        """{server: srv_admin_state} of the backend, as HAProxy holds it now (`show servers state`)."""
        answer = command(self.socket_path, "show servers state " + self.backend)
        states = {}
        for line in answer.splitlines():
            f = line.split()   # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state ...
            if len(f) > 6 and f[0].isdigit() and f[1] == self.backend:
                states[f[3]] = int(f[6])
        if not states and not answer.startswith("1"):   # its first line is the format's version, 1
            raise HAProxyError("HAProxy refused 'show servers state %s': %s" % (self.backend, answer))
        return states

    def reconcile(self) -> None:
        """Drain every leased node's worker that HAProxy does not hold out of service now (smem's drain lost
        to a reload, or undone by hand, is drained again); return the ones smem drained whose lease ended. A
        worker already drained or in maintenance that smem did not drain is an operator's: never recorded, so
        never returned. A failure is logged and left for the next call; nothing is recorded that did not
        happen."""
        with self.lock:
            leased, ours = set(self.lease_nodes()), self.drained()
            try:
                states = self.admin_states()
            except (OSError, HAProxyError) as e:
                LOG.warning("could not read the LLM workers' state in HAProxy (%s): will try again", e)
                return
            for node in sorted(leased):
                if node not in states:
                    continue   # the node runs no worker
                if states[node] & (FDRAIN | FMAINT):
                    continue   # out of service already: smem's drain, or an operator's
                try:
                    if self._set(node, "drain") and node not in ours:
                        with self.db.tx() as c:
                            c.execute("INSERT OR IGNORE INTO worker_drains VALUES (?, ?)", (node, now()))
                    if node in ours:
                        LOG.warning("%s's LLM worker was back in service during its lease (a reload?): drained "
                                    "again", node)
                except (OSError, HAProxyError) as e:
                    LOG.warning("could not drain %s's LLM worker in HAProxy (%s): will try again", node, e)
            for node in sorted(ours - leased):
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
