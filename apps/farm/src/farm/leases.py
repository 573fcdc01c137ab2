"""smem's lease routes, as a client: the farm borrows nodes for a job and gives them back."""

from __future__ import annotations

import httpx


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
