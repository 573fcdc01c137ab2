"""Leases: the render farm borrows nodes. Kept in the database (a restarted smem honours them) and
mirrored in the lanes, which stop sending calls to a leased node and take it back when the lease expires."""

from __future__ import annotations

import json
import time
from datetime import datetime

from smem.db import DB, new_id, now
from smem.errors import Conflict, NotFound
from smem.lanes import Lanes, iso


class BadLease(ValueError):
    status = 400


def _epoch(t: str) -> float:
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


def _public(row: dict) -> dict:
    return {"id": row["id"], "nodes": json.loads(row["nodes"]), "holder": row["holder"],
            "createdAt": row["created_at"], "expiresAt": row["expires_at"]}


class Leases:
    def __init__(self, db: DB, lanes: Lanes, on_change=None):
        """on_change(): called after a lease starts or ends (smem.haproxy's reconcile)."""
        self.db, self.lanes, self.on_change = db, lanes, on_change or (lambda: None)
        for lease in self.live():
            self._mirror(lease)

    def live_nodes(self) -> set[str]:
        return {n for lease in self.live() for n in lease["nodes"]}

    def _mirror(self, lease: dict) -> None:
        self.lanes.lease(lease["nodes"], {"id": lease["id"], "holder": lease["holder"],
                                          "expiresAt": lease["expiresAt"], "until": _epoch(lease["expiresAt"])})

    def live(self) -> list[dict]:
        return [_public(r) for r in self.db.rows("SELECT * FROM leases WHERE released_at IS NULL AND expires_at > ?"
                                                 " ORDER BY created_at", (now(),))]

    def create(self, nodes: list[str], holder: str, ttl_s: float) -> dict:
        """Records the lease, stops new calls to its nodes, waits (bounded by their lanes' timeouts) for the
        calls in flight there; the lease with drained = whether they all finished in time."""
        unknown = sorted(set(nodes) - self.lanes.nodes)
        if unknown:
            raise BadLease("unknown node(s): %s" % ", ".join(unknown))
        with self.db.tx() as c:
            for lease in self.live():
                taken = sorted(set(nodes) & set(lease["nodes"]))
                if taken:
                    raise Conflict("node(s) %s already leased by %s (lease %s, until %s)"
                                   % (", ".join(taken), lease["holder"], lease["id"], lease["expiresAt"]))
            lease = {"id": new_id("lse"), "nodes": sorted(set(nodes)), "holder": holder,
                     "createdAt": now(), "expiresAt": iso(time.time() + ttl_s)}
            c.execute("INSERT INTO leases(id, holder, nodes, created_at, expires_at) VALUES (?,?,?,?,?)",
                      (lease["id"], holder, json.dumps(lease["nodes"]), lease["createdAt"], lease["expiresAt"]))
        self._mirror(lease)
        self.on_change()
        bound = max(cfg["timeout_s"] for lane, cfg in self.lanes.config.items()
                    if any(n in cfg["nodes"] for n in nodes))
        return {**lease, "drained": self.lanes.drain(lease["nodes"], bound)}

    def renew(self, lease_id: str, ttl_s: float) -> dict:
        """The live lease extended in place: same id and nodes, expiresAt = now + ttl_s. An expired or
        released lease is NotFound: its nodes may have been lent again, so it cannot be revived."""
        before = None
        try:
            with self.db.tx() as c:
                row = self.db.one("SELECT * FROM leases WHERE id=? AND released_at IS NULL AND expires_at > ?",
                                  (lease_id, now()))
                if row is None:
                    raise NotFound("no live lease %s" % lease_id)
                before = _public(row)
                lease = {**before, "expiresAt": iso(time.time() + ttl_s)}
                c.execute("UPDATE leases SET expires_at=? WHERE id=?", (lease["expiresAt"], lease_id))
                # Mirrored before the commit, under the write lock: a DELETE of this lease commits after
                # it, so its unlease comes after this too and cannot be undone by it.
                self._mirror(lease)
        except BaseException:
            if before is not None:   # the commit failed: the lanes go back to what the database holds
                self._mirror(before)
            raise
        return lease

    def release(self, lease_id: str) -> dict:
        with self.db.tx() as c:
            row = self.db.one("SELECT * FROM leases WHERE id=? AND released_at IS NULL AND expires_at > ?",
                              (lease_id, now()))
            if row is None:
                raise NotFound("no live lease %s" % lease_id)
            c.execute("UPDATE leases SET released_at=? WHERE id=?", (now(), lease_id))
        self.lanes.unlease(lease_id)
        self.on_change()
        return {**_public(row), "released": True}
