#!/usr/bin/env python3
"""A search in smem through the node lanes, for the hardware evidence (playbooks/verify-hardware.yml):
a token of its own for a namespace of its own (made with the admin token, which never leaves this
process), one sentence ingested (embedded on the background lane), searched (the interactive lane),
then the sentence erased and the token revoked. Prints one JSON line; never a secret.
Usage: evidence-smem-search.py URL ADMIN_TOKEN_FILE TIMEOUT_S"""

import json
import sys
import time
import urllib.error
import urllib.request

url, admin_file, timeout_s = sys.argv[1].rstrip("/"), sys.argv[2], float(sys.argv[3])
NS = "vcafleet-evidence"
SENTENCE = "The evidence run checked this card's search lanes at %s." % time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                         time.gmtime())


def call(method, path, token, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data, method=method,
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    with open(admin_file) as fh:
        admin = fh.read().strip()
    status, made = call("POST", "/v5/admin/tokens", admin, {"namespaces": [NS], "label": "vcafleet-evidence"})
    if status != 201:
        return {"found": False, "reason": "could not make a token: HTTP %d" % status}
    token = made["token"]
    try:
        started = time.monotonic()
        status, doc = call("POST", "/v5/ns/%s/documents" % NS, token, {"content": SENTENCE})
        if status != 202:
            return {"found": False, "reason": "ingest refused: HTTP %d %s" % (status, doc)}
        while True:
            _, got = call("GET", "/v5/ns/%s/documents/%s" % (NS, doc["id"]), token)
            if got["status"] in ("done", "failed") or time.monotonic() - started > timeout_s:
                break
            time.sleep(1)
        ingest_s = round(time.monotonic() - started, 1)
        if got["status"] != "done":
            return {"found": False, "reason": "ingest %s after %.0f s" % (got["status"], ingest_s)}
        t0 = time.monotonic()
        status, out = call("POST", "/v5/ns/%s/search" % NS, token, {"q": "Which lanes did the evidence run check?",
                                                                      "mode": "chunks"})
        search_ms = round((time.monotonic() - t0) * 1000, 1)
        found = status == 200 and any(SENTENCE in r.get("content", "") for r in out.get("results", []))
        call("DELETE", "/v5/ns/%s/documents/%s?erase=true" % (NS, doc["id"]), token)
        return {"found": found, "ingest_s": ingest_s, "search_ms": search_ms,
                "served": out.get("served") if status == 200 else None,
                "degraded": out.get("degraded") if status == 200 else None,
                "reason": "" if found else "the sentence was not found (HTTP %d)" % status}
    finally:
        call("DELETE", "/v5/admin/tokens/%s" % made["id"], admin)


result = main()
print(json.dumps(result))
sys.exit(0 if result["found"] else 1)
