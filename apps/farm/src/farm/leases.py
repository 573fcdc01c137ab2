"""smem's lease routes, as a client: the farm borrows nodes for a job and gives them back. The
coordinator's loop never waits for smem (README "Leases"): each call runs on a thread of its own and
its outcome is collected at a later tick."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future

import httpx

log = logging.getLogger("farm.leases")


class LeaseConflict(Exception):
    """A node asked for is under another live lease (smem's 409)."""


class LeaseError(Exception):
    pass


class LeaseClient:
    def __init__(self, url: str, token: str, *, timeout: float = 10.0, take_timeout: float = 150.0):
        # smem answers a take once the nodes' calls in flight are done (up to a lane's timeout_s), the rest at once
        self.take_timeout = take_timeout
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
            "nodes": nodes, "holder": holder, "ttlSeconds": ttl_s}, timeout=self.take_timeout), "take lease")

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
SWEEP = ("sweep",)          # the calls' keys: (what, job id) for a job's, these two for the sweep's
ORPHANS = ("orphans",)


class LeaseKeeper:
    """A job's leases, in smem and in the database: taken, renewed, given back, and the orphans
    released (a lease smem holds for a farm job that the database does not hold as that job's: a
    take that timed out after smem granted it, one taken just before a crash, a renewal answered too
    late). Every smem call runs on a thread of its own (`_start`); the coordinator's loop calls these
    methods again at its next ticks and gets the outcome once the call has ended (`_ended`), so the
    loop never waits on smem and its AMQP heartbeats go on. Only the loop touches the database."""

    def __init__(self, s, db, client: LeaseClient | None):
        self.s, self.db, self.client = s, db, client
        self.calls: dict[tuple, Future] = {}
        self.sweep_wanted = False      # at once: after a take that timed out, at start
        self.sweep_at = 0.0            # the next periodic sweep (monotonic)
        self._orphan_jobs: dict[str, str] = {}     # the orphans being released: lease id -> its job

    # -- the calls, off the loop -------------------------------------------------------------
    def _start(self, key: tuple, fn, *args) -> None:
        fut: Future = Future()
        self.calls[key] = fut

        def call():
            try:
                fut.set_result(fn(*args))
            except BaseException as e:   # handed to the loop, which raises it where it collects
                fut.set_exception(e)
        # a daemon: a call that hangs holds up neither the loop nor the coordinator's exit
        threading.Thread(target=call, name="farm-smem-%s" % "-".join(key), daemon=True).start()

    def _ended(self, key: tuple) -> Future | None:
        """The call under key once it has ended (forgotten here), else None."""
        fut = self.calls.get(key)
        if fut is None or not fut.done():
            return None
        del self.calls[key]
        return fut

    def busy(self, jid: str, what: str | None = None) -> bool:
        """A call for the job (a take, renew or release; or that one) is under way or not yet collected."""
        return any(len(k) == 2 and k[1] == jid and what in (None, k[0]) for k in self.calls)

    def waiting(self, jid: str) -> bool:
        """The job's next take waits for nothing but the loop: a call of its own, or a sweep it waits for."""
        return self.client is not None and (self.busy(jid) or self.sweep_wanted or SWEEP in self.calls
                                            or ORPHANS in self.calls)

    # -- a job's lease -------------------------------------------------------------------------
    def take(self, jid: str, nodes: list[str]) -> dict | None:
        """The lease, once smem has granted it (recorded then); None while the take is under way, or
        what it waits for (ours from a start cut short given back, a sweep). Raises LeaseConflict
        (leased elsewhere), LeaseError or httpx.HTTPError (smem away, or no answer in time)."""
        key = ("take", jid)
        if key not in self.calls:
            if not self.release_all(jid):          # ours, from a start cut short
                return None
            if self.sweep_wanted or SWEEP in self.calls or ORPHANS in self.calls:
                return None     # a lease of ours that smem granted too late would make this take a 409
            self._start(key, self.client.take, nodes, HOLDER + jid, self.s.lease_ttl_s)
            return None
        return self._took(jid)

    def _took(self, jid: str) -> dict | None:
        fut = self._ended(("take", jid))
        if fut is None:
            return None
        try:
            lease = fut.result()
        except httpx.TransportError as e:
            if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):       # it never reached smem
                raise
            self.sweep_wanted = True     # smem may have granted it after all: found and released
            raise LeaseError("smem did not answer the take in time (%s: %s; lease_take_timeout_s %g); its leases"
                             " are checked for one it granted anyway" % (type(e).__name__, e,
                                                                         self.s.lease_take_timeout_s)) from e
        self._record(jid, lease)
        self.db.event(jid, "lease %s on %s until %s" % (lease["id"], ", ".join(lease["nodes"]), lease.get("expiresAt")))
        return lease

    def renew(self, jid: str) -> tuple[str, str] | None:
        """None when renewed, under way (started now), or nothing to renew; (lease id, why) when the lease
        is lost: smem lent the nodes to another since it ran out, or it could not be renewed (no answer,
        an error) before it runs out."""
        row = self.db.one("SELECT * FROM leases WHERE job_id=? AND released_at IS NULL ORDER BY taken_at DESC",
                          (jid,))
        if row is None or self.client is None:
            return None
        key = ("renew", jid)
        runs_out_soon = time.time() > (row["renewed_at"] or row["taken_at"]) + self.s.lease_ttl_s - self.s.lease_renew_s
        if key not in self.calls:
            self._start(key, self.client.renew, {"id": row["id"], "nodes": json.loads(row["nodes"])},
                        HOLDER + jid, self.s.lease_ttl_s)
            return None
        fut = self._ended(key)
        if fut is None:
            if not runs_out_soon:
                return None
            # given up: whatever smem answers later is an orphan then (the database holds the lease released)
            self.calls.pop(key).add_done_callback(lambda _: setattr(self, "sweep_wanted", True))
            return row["id"], "smem did not answer its renewal before it runs out"
        return self._renewed(jid, row, fut, runs_out_soon)

    def _renewed(self, jid: str, row: dict, fut: Future, runs_out_soon: bool) -> tuple[str, str] | None:
        try:
            new = fut.result()
        except LeaseConflict as e:
            return row["id"], "its nodes are leased to another now (%s)" % e
        except (LeaseError, httpx.HTTPError) as e:
            self.db.event(jid, "lease %s not renewed: %s" % (row["id"], e))
            return (row["id"], "not renewed before it runs out (%s)" % e) if runs_out_soon else None
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

    def _released(self, lease_id: str, jid: str, outcome, why: str = "") -> None:
        self.db.c.execute("UPDATE leases SET released_at=? WHERE id=? AND released_at IS NULL", (time.time(), lease_id))
        self.db.event(jid, "lease %s %s%s" % (lease_id, "released" if outcome else "was no longer live", why))

    def _release_each(self, ids: list[str]) -> dict:
        """On a call's thread: {lease id: True (released), False (no longer live), or the error}."""
        out = {}
        for lid in ids:
            try:
                out[lid] = self.client.release(lid)
            except (LeaseError, httpx.HTTPError) as e:
                out[lid] = e
        return out

    def _record_releases(self, outcomes: dict, jobs: dict, why: str = "") -> None:
        """The ended releases recorded; then the first error, if any, raised."""
        errors = [e for e in outcomes.values() if isinstance(e, Exception)]
        for lid, outcome in outcomes.items():
            if not isinstance(outcome, Exception):
                self._released(lid, jobs[lid], outcome, why)
        if errors:
            raise errors[0]

    def release_all(self, jid: str) -> bool:
        """True once the job holds no lease (given back now, or none); False while that is under way.
        A take or renewal still under way is collected first: what it brings is given back too. Raises
        LeaseError or httpx.HTTPError (smem away): the caller tries again later."""
        for what, collect in (("take", self._took), ("renew", self.renew)):
            if (what, jid) in self.calls:
                try:
                    collect(jid)
                except (LeaseError, httpx.HTTPError):
                    pass
                if (what, jid) in self.calls:
                    return False
        key = ("release", jid)
        if key not in self.calls:
            ids = [r["id"] for r in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL",
                                                 (jid,))]
            if not ids:
                return True
            if self.client is None:
                self._record_releases({lid: False for lid in ids}, {lid: jid for lid in ids})
                return True
            self._start(key, self._release_each, ids)
            return False
        fut = self._ended(key)
        if fut is None:
            return False
        outcomes = fut.result()
        self._record_releases(outcomes, {lid: jid for lid in outcomes})
        return not any(isinstance(e, Exception) for e in outcomes.values()) and self.release_all(jid)

    # -- the orphans -----------------------------------------------------------------------------
    def sweep(self) -> None:
        """At each tick: smem's leases listed (at start, after a take that timed out, and every
        lease_sweep_s), and those of a farm job that the database does not hold as that job's live
        lease released. A job with a call under way is left alone: the lease smem granted it may be
        in smem's list before its take's answer is collected here."""
        if self.client is None:
            return
        if ORPHANS in self.calls:
            fut = self._ended(ORPHANS)
            if fut is not None:
                outcomes, holders = fut.result(), self._orphan_jobs
                try:
                    self._record_releases(outcomes, holders, ": smem held it for the farm, farm.db did not")
                except (LeaseError, httpx.HTTPError) as e:
                    log.warning("an orphan lease not released (%s); trying again", e)
                    self.sweep_wanted = True
            return
        if SWEEP not in self.calls:
            if self.sweep_wanted or time.monotonic() >= self.sweep_at:
                self.sweep_wanted = False
                self.sweep_at = time.monotonic() + self.s.lease_sweep_s
                self._start(SWEEP, self.client.live)
            return
        fut = self._ended(SWEEP)
        if fut is None:
            return
        try:
            live = fut.result()
        except (LeaseError, httpx.HTTPError) as e:
            log.warning("smem leases not listed: %s; trying again", e)
            self.sweep_at = min(self.sweep_at, time.monotonic() + self.s.lease_retry_s)
            return
        busy = {k[1] for k in self.calls if len(k) == 2}
        self._orphan_jobs = {}
        for lease in live:
            holder = lease.get("holder") or ""
            jid = holder[len(HOLDER):]
            if not holder.startswith(HOLDER) or jid in busy:
                continue
            if not self.db.one("SELECT 1 AS x FROM leases WHERE id=? AND released_at IS NULL", (lease["id"],)):
                log.info("releasing orphan lease %s of %s", lease["id"], holder)
                self._orphan_jobs[lease["id"]] = jid
        if self._orphan_jobs:
            self._start(ORPHANS, self._release_each, list(self._orphan_jobs))
