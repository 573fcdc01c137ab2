"""smem's lease routes, as a client: the farm borrows nodes for a job and gives them back."""

from __future__ import annotations

import json
import logging
import time

import httpx

log = logging.getLogger("farm.leases")


class LeaseConflict(Exception):
    """A node asked for is under another live lease (smem's 409)."""


class LeaseError(Exception):
    pass


class LeaseClient:
    def __init__(self, url: str, token: str, *, timeout: float = 60.0):
        # smem answers a POST once the nodes' calls in flight are done: up to a lane's timeout_s.
        self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout,
                                 headers={"Authorization": "Bearer " + token})
        self.patch_renew = True   # until an smem without the renew route answers 405: then renew re-takes

    def close(self) -> None:
        self.http.close()

    def _check(self, r: httpx.Response, what: str) -> dict:
        if r.status_code == 409:
            raise LeaseConflict(r.json().get("error", r.text))
        if r.status_code >= 400:
            raise LeaseError("%s: %d %s" % (what, r.status_code, r.text[:300]))
        return r.json()

    def take(self, nodes: list[str], holder: str, ttl_s: float) -> dict:
        """{id, nodes, expiresAt, drained, ...}; LeaseConflict if a node is leased already."""
        return self._check(self.http.post("/v5/admin/leases", json={
            "nodes": nodes, "holder": holder, "ttlSeconds": ttl_s}), "take lease")

    def release(self, lease_id: str) -> bool:
        """True if released now, False if smem no longer had it live (expired or released before)."""
        r = self.http.delete("/v5/admin/leases/" + lease_id)
        if r.status_code == 404:
            return False
        self._check(r, "release lease")
        return True

    def renew(self, lease: dict, holder: str, ttl_s: float) -> dict:
        """The lease with a new expiresAt, by PATCH. An smem without that route (405): the lease is
        released and taken again at once, a new id; a lease that had expired (404) is taken again."""
        if self.patch_renew:
            r = self.http.patch("/v5/admin/leases/" + lease["id"], json={"ttlSeconds": ttl_s})
            if r.status_code == 405:
                self.patch_renew = False
            elif r.status_code != 404:
                return {**lease, **self._check(r, "renew lease")}
        self.release(lease["id"])
        return self.take(lease["nodes"], holder, ttl_s)

    def live(self) -> list[dict]:
        return self._check(self.http.get("/v5/admin/leases"), "list leases")["leases"]


HOLDER = "farm job "


class LeaseKeeper:
    """A job's leases, in smem and in the database: taken, renewed, given back, and the orphans (smem
    holds them for a farm job that is not live here) released."""

    def __init__(self, s, db, client: LeaseClient | None):
        self.s, self.db, self.client = s, db, client

    def take(self, jid: str, nodes: list[str]) -> dict:
        """Raises LeaseConflict (leased elsewhere), LeaseError or httpx.HTTPError (smem away)."""
        for row in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,)):
            self.release(row["id"], jid)          # ours, from a start cut short
        lease = self.client.take(nodes, HOLDER + jid, self.s.lease_ttl_s)
        self._record(jid, lease)
        self.db.event(jid, "lease %s on %s until %s" % (lease["id"], ", ".join(lease["nodes"]), lease.get("expiresAt")))
        return lease

    def renew(self, jid: str) -> tuple[str, str] | None:
        """None when renewed (or nothing to renew); (lease id, why) when the lease is lost: smem lent the
        nodes to another since it ran out, or it could not be renewed before it runs out."""
        row = self.db.one("SELECT * FROM leases WHERE job_id=? AND released_at IS NULL ORDER BY taken_at DESC",
                          (jid,))
        if row is None or self.client is None:
            return None
        lease = {"id": row["id"], "nodes": json.loads(row["nodes"])}
        try:
            new = self.client.renew(lease, HOLDER + jid, self.s.lease_ttl_s)
        except LeaseConflict as e:
            return row["id"], "its nodes are leased to another now (%s)" % e
        except (LeaseError, httpx.HTTPError) as e:
            self.db.event(jid, "lease %s not renewed: %s" % (row["id"], e))
            if time.time() > (row["renewed_at"] or row["taken_at"]) + self.s.lease_ttl_s - self.s.lease_renew_s:
                return row["id"], "not renewed before it runs out (%s)" % e
            return None
        with self.db.tx() as c:
            if new["id"] != row["id"]:
                c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), row["id"]))
                self._record(jid, new, c)
            c.execute("UPDATE leases SET renewed_at=?, expires_at=? WHERE id=?",
                      (time.time(), new.get("expiresAt"), new["id"]))
        return None

    def _record(self, jid: str, lease: dict, c=None) -> None:
        (c or self.db.c).execute("INSERT INTO leases(id, job_id, nodes, taken_at, expires_at) VALUES (?,?,?,?,?)",
                                 (lease["id"], jid, json.dumps(lease["nodes"]), time.time(), lease.get("expiresAt")))

    def release(self, lease_id: str, jid: str) -> None:
        released = self.client.release(lease_id) if self.client else False
        self.db.c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), lease_id))
        self.db.event(jid, "lease %s %s" % (lease_id, "released" if released else "was no longer live"))

    def release_all(self, jid: str) -> None:
        for row in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,)):
            self.release(row["id"], jid)

    def release_orphans(self, live_states) -> None:
        """A lease smem holds for a farm job that is not live here (taken just before a crash, say)."""
        try:
            live = self.client.live()
        except (LeaseError, httpx.HTTPError) as e:
            log.warning("smem leases not listed: %s", e)
            return
        for lease in live:
            if not lease.get("holder", "").startswith(HOLDER):
                continue
            jid = lease["holder"][len(HOLDER):]
            job = self.db.job(jid)
            known = self.db.one("SELECT 1 AS x FROM leases WHERE id=? AND released_at IS NULL", (lease["id"],))
            if job is None or job["state"] not in live_states or not known:
                log.info("releasing orphan lease %s of %s", lease["id"], lease["holder"])
                self.release(lease["id"], jid)
