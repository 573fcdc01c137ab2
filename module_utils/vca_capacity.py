# SPDX-License-Identifier: MIT
"""The additive-capacity benchmark's accounting (playbooks/bench/capacity.yml, docs/CAPACITY.md).

- Energy: one snapshot of every RAPL package (package-0, package-1, ...: every socket) per machine
  before and after a leg's load; each package's difference is taken modulo its max_energy_range_uj
  (vca_sensors.energy_delta_uj, as vcamon does) and the packages are summed. A machine without a
  counter, or whose counters changed range or zones between the two readings, has no energy figure,
  and then neither has the leg: a missing counter is never 0 J.
- Every leg is charged the host's energy over its run too (the frontend's: it runs Locust and
  HAProxy for every chat leg, and the card cannot run without a host powered on): "card alone" is
  the nodes plus the host's idle, Locust and HAProxy; the nodes' own figure is kept beside it
  (tok_j_workers).
- Tokens: Locust 2.x's own --json-file for requests, failures and its latency histogram; the
  locustfile's token file (playbooks/bench/files/capacity_locustfile.py) for the completion
  tokens of every answer and the run's start and stop.
- Transcode: ffmpeg's -progress output (frames encoded) over the wall time of the run.
- The record: every leg with its machines, figures, energy and platform label; the ratios of the
  scaling curve; the run's label. Lab figures are labelled lab and kept apart from the seed's.
"""

from __future__ import annotations

import json
import math
import time

from .vca_sensors import energy_delta_uj, platform, rapl_package_zones

RECORD_FORMAT = "vcafleet-capacity/1"
TOKENS_FORMAT = "vcafleet-capacity-tokens/1"
# The seed's hardware figures (issue 16), kept apart from this run's: never compared as one kind.
SEED = {
    "label": "seed (hardware, TinyLlama-1.1B Q4)",
    "platform": "hardware",
    "rows": [
        {"setup": "host alone (18-core E5-2699 v3)", "tok_s": 82.9, "tok_j": 0.53},
        {"setup": "one card (3 nodes)", "tok_s": 88.4, "tok_j": 0.81},
        {"setup": "both", "tok_s": 172.5, "tok_j": 0.74},
    ],
    "scaling_tok_s": [29.7, 58.6, 88.0],
    "transcode": "+444 fps (+65%) for +36 W",
}


# --- energy -------------------------------------------------------------------------------------

def _read_zone(sysfs, zone):
    """(energy_uj, max_energy_range_uj) of one zone, or a string saying why not."""
    energy = sysfs.read_optional(zone + "/energy_uj")
    max_range = sysfs.read_optional(zone + "/max_energy_range_uj")
    if energy in (None, "") or max_range in (None, ""):
        return "%s has no %s" % (zone, "energy_uj" if energy in (None, "") else "max_energy_range_uj")
    try:
        energy, max_range = int(energy), int(max_range)
    except ValueError:
        return "%s: unreadable counter %r / %r" % (zone, energy, max_range)
    if max_range <= 0:
        return "%s: max_energy_range_uj is %d" % (zone, max_range)
    return energy, max_range


def energy_snapshot(sysfs, clock=time.time, proc_root="/proc"):
    """The machine's RAPL package counters now: zones {zone: {energy_uj, max_energy_range_uj}} (every
    package), t (epoch s) and the platform label; zone, energy_uj and max_energy_range_uj are the
    first package's. Without a package zone, or with one unreadable, energy_uj is None and reason says
    why (a machine is measured whole or not at all)."""
    snap = {"t": clock(), "platform": platform(sysfs, proc_root), "zone": None, "zones": None,
            "energy_uj": None, "max_energy_range_uj": None, "reason": None}
    zones = rapl_package_zones(sysfs)
    if not zones:
        snap["reason"] = "no RAPL package-0 zone under %s" % sysfs.root
        return snap
    snap["zone"] = zones[0]
    read = {}
    for zone in zones:
        got = _read_zone(sysfs, zone)
        if isinstance(got, str):
            snap["reason"] = got
            return snap
        read[zone] = {"energy_uj": got[0], "max_energy_range_uj": got[1]}
    snap["zones"] = read
    snap["energy_uj"], snap["max_energy_range_uj"] = read[zones[0]]["energy_uj"], read[zones[0]]["max_energy_range_uj"]
    return snap


def machine_energy(before, after):
    """{joules, seconds, watts, reason} between two snapshots of one machine; joules None when
    either lacks a counter or the counter is not the same one (zone or range changed)."""
    out = {"joules": None, "seconds": None, "watts": None, "reason": None}
    if not before or not after:
        out["reason"] = "no %s snapshot" % ("before" if not before else "after")
        return out
    if before.get("t") is not None and after.get("t") is not None:
        out["seconds"] = after["t"] - before["t"]
    for snap, when in ((before, "before"), (after, "after")):
        if snap.get("energy_uj") is None or snap.get("max_energy_range_uj") is None:
            out["reason"] = "no energy counter (%s: %s)" % (when, snap.get("reason") or "not read")
            return out
    zones = {z: v["max_energy_range_uj"] for z, v in (before.get("zones") or {}).items()}
    if (before.get("zone") != after.get("zone") or before["max_energy_range_uj"] != after["max_energy_range_uj"]
            or zones != {z: v["max_energy_range_uj"] for z, v in (after.get("zones") or {}).items()}):
        out["reason"] = "the counter changed between the readings (zones or max_energy_range_uj)"
        return out
    if out["seconds"] is None or out["seconds"] <= 0:
        out["reason"] = "the snapshots' times do not advance"
        return out
    if zones:            # every package, each across its own wrap
        uj = sum(energy_delta_uj(before["zones"][z]["energy_uj"], after["zones"][z]["energy_uj"], r)
                 for z, r in zones.items())
    else:                # a snapshot of one package only (an older record)
        uj = energy_delta_uj(before["energy_uj"], after["energy_uj"], before["max_energy_range_uj"])
    out["joules"] = uj / 1e6
    out["watts"] = out["joules"] / out["seconds"]
    return out


def leg_energy(machines, before, after):
    """Energy of a leg: per machine, and the sums. before/after: {machine: snapshot}.

    joules and watts are None unless every machine of the leg has a figure; missing names those
    without one (and why)."""
    per, missing = {}, {}
    for m in machines:
        e = machine_energy((before or {}).get(m), (after or {}).get(m))
        per[m] = e
        if e["joules"] is None:
            missing[m] = e["reason"]
    complete = bool(machines) and not missing
    return {
        "machines": per,
        "joules": sum(per[m]["joules"] for m in machines) if complete else None,
        "watts": sum(per[m]["watts"] for m in machines) if complete else None,
        "missing": missing,
    }


# --- percentiles and Locust's output ------------------------------------------------------------

def percentile(values, q):
    """The q-th percentile (0-100) by linear interpolation between closest ranks (numpy's
    default); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("percentile %r is not in 0..100" % q)
    xs = sorted(float(v) for v in values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def histogram_percentile(response_times, q):
    """Locust's percentile of its response-time histogram ({rounded ms: count}): the smallest
    bucket at or under which q percent of the requests fall (Locust's own rule)."""
    counts = sorted((float(k), int(v)) for k, v in (response_times or {}).items())
    total = sum(c for _, c in counts)
    if not total:
        return None
    need = int(total * q / 100.0)
    seen = 0
    for ms, c in reversed(counts):
        seen += c
        if total - seen <= need:
            return ms
    return counts[0][0]


def parse_locust_json(text):
    """Locust 2.x --json-file content (a list of stats entries) summed over the entries:
    requests, failures, the merged histogram, its p50/p95, and the first and last request times."""
    entries = json.loads(text) if isinstance(text, str) else text
    if not isinstance(entries, list):
        raise ValueError("Locust's JSON stats are a list of entries, got %s" % type(entries).__name__)
    hist, out = {}, {"requests": 0, "failures": 0, "entries": [], "start": None, "last": None}
    for e in entries:
        out["requests"] += int(e["num_requests"])
        out["failures"] += int(e["num_failures"])
        out["entries"].append("%s %s" % (e.get("method"), e.get("name")))
        for k, v in (e.get("response_times") or {}).items():
            hist[k] = hist.get(k, 0) + int(v)
        if e.get("start_time") is not None:
            out["start"] = e["start_time"] if out["start"] is None else min(out["start"], e["start_time"])
        if e.get("last_request_timestamp") is not None:
            last = e["last_request_timestamp"]
            out["last"] = last if out["last"] is None else max(out["last"], last)
    out["p50_ms"] = histogram_percentile(hist, 50)
    out["p95_ms"] = histogram_percentile(hist, 95)
    return out


def token_summary(doc):
    """The locustfile's token file: answered requests, completion and prompt tokens (of the
    answers that carried usage), the run's seconds, and exact p50/p95 of the answered requests."""
    doc = json.loads(doc) if isinstance(doc, str) else doc
    if doc.get("format") != TOKENS_FORMAT:
        raise ValueError("not a capacity token file (format %r)" % doc.get("format"))
    if doc.get("start") is None or doc.get("stop") is None or doc["stop"] <= doc["start"]:
        raise ValueError("the token file has no run time (start %r, stop %r)" % (doc.get("start"), doc.get("stop")))
    samples = doc.get("samples") or []
    ok = [s for s in samples if s.get("ok") and s.get("completion_tokens") is not None]
    latencies = [s["ms"] for s in ok]
    ttft = [s["ttft_ms"] for s in ok if s.get("ttft_ms") is not None]
    workers = {}
    for s in samples:
        if s.get("worker"):
            workers[s["worker"]] = workers.get(s["worker"], 0) + 1
    return {
        "workers": workers,
        "samples": len(samples),
        "answered": len(ok),
        "unanswered": len(samples) - len(ok),
        "completion_tokens": sum(int(s["completion_tokens"]) for s in ok),
        "prompt_tokens": sum(int(s.get("prompt_tokens") or 0) for s in ok),
        "seconds": doc["stop"] - doc["start"],
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "max_tokens": doc.get("max_tokens"),
        "stream": bool(doc.get("stream")),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
    }


def chat_load(locust_json, tokens_doc):
    """One leg's load figures from Locust's JSON stats and the token file."""
    stats = parse_locust_json(locust_json)
    tokens = token_summary(tokens_doc)
    load = {
        "requests": stats["requests"],
        "failures": stats["failures"],
        "completion_tokens": tokens["completion_tokens"],
        "prompt_tokens": tokens["prompt_tokens"],
        "seconds": round(tokens["seconds"], 3),
        "tok_s": tokens["completion_tokens"] / tokens["seconds"],
        "p50_ms": tokens["p50_ms"],
        "p95_ms": tokens["p95_ms"],
        "stream": tokens["stream"],
        "ttft_p50_ms": tokens["ttft_p50_ms"],
        "ttft_p95_ms": tokens["ttft_p95_ms"],
        "locust": {"p50_ms": stats["p50_ms"], "p95_ms": stats["p95_ms"], "entries": stats["entries"]},
        "consistent": tokens["samples"] == stats["requests"] and tokens["unanswered"] == stats["failures"],
        "workers": tokens["workers"],
    }
    if not load["consistent"]:
        load["note"] = ("Locust counted %d requests / %d failures, the token file %d / %d"
                        % (stats["requests"], stats["failures"], tokens["samples"], tokens["unanswered"]))
    return load


# --- ffmpeg -------------------------------------------------------------------------------------

def parse_ffmpeg_progress(text):
    """The last block of ffmpeg's -progress output as a dict (frame, fps, progress, ...)."""
    blocks, current = [], {}
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        current[key] = value.strip()
        if key == "progress":
            blocks.append(current)
            current = {}
    last = blocks[-1] if blocks else current
    if "frame" in last:
        last["frame"] = int(last["frame"])
    return last


def transcode_result(progress_text, seconds, frames_wanted, encoder):
    """fps of one machine's run: frames ffmpeg says it encoded over the run's wall seconds."""
    progress = parse_ffmpeg_progress(progress_text)
    frames = progress.get("frame")
    done = progress.get("progress") == "end" and frames is not None
    out = {"encoder": encoder, "frames": frames, "frames_wanted": frames_wanted, "seconds": round(seconds, 3),
           "fps": None, "reason": None}
    if not done:
        out["reason"] = "ffmpeg did not report the end of its run"
    elif frames != frames_wanted:
        out["reason"] = "ffmpeg encoded %s of %s frames" % (frames, frames_wanted)
    elif seconds <= 0:
        out["reason"] = "no run time"
    else:
        out["fps"] = frames / seconds
    return out


# --- legs, scaling and the record ---------------------------------------------------------------

def leg_platform(labels):
    """One label for a leg: lab when any machine is simulated, hardware only when all are."""
    labels = [lab or "unknown" for lab in labels]
    if not labels:
        return "unknown"
    if "lab" in labels:
        return "lab"
    if all(lab == "hardware" for lab in labels):
        return "hardware"
    return "unknown"


def _rnd(v, nd):
    return None if v is None else round(v, nd)


def _window(energy):
    """The longest of the machines' snapshot intervals: the energy covers it, the load less."""
    spans = [e["seconds"] for e in energy["machines"].values() if e.get("seconds") is not None]
    return round(max(spans), 3) if spans else None


def _leg(leg, kind, before, after, host=None):
    """What every leg's record has: its name, setup, kind and machines, their platform labels (from
    the snapshots) and the leg's energy: its machines' and the host's (energy_machines), and its
    machines' alone (workers_energy)."""
    charged = list(leg["machines"]) + ([host] if host and host not in leg["machines"] else [])
    energy = leg_energy(charged, before, after)
    labels = [(after or {}).get(m, (before or {}).get(m, {})).get("platform") for m in leg["machines"]]
    return {"name": leg["name"], "setup": leg.get("setup", leg["name"]), "kind": kind,
            "machines": list(leg["machines"]), "platform": leg_platform(labels) if any(labels) else None,
            "platforms": dict(zip(leg["machines"], labels, strict=True)), "energy": energy,
            "energy_machines": charged, "workers_energy": leg_energy(leg["machines"], before, after)}


def chat_leg(leg, load, before, after, host=None):
    """A chat leg's record: leg = {name, setup, machines}; load = chat_load() or None (not run); host:
    the machine charged with every leg too (the frontend)."""
    out = _leg(leg, "chat", before, after, host)
    energy = out["energy"]
    out.update(load=load, tok_s=None, tok_j=None, tok_j_workers=None, p50_ms=None, p95_ms=None,
               ttft_p50_ms=None, ttft_p95_ms=None, stream=bool(leg.get("stream")), energy_window_s=_window(energy))
    if load is None:
        out["reason"] = leg.get("reason") or "no load result: the leg failed or did not run (see the play's output)"
        return out
    strays = sorted(w for w in (load.get("workers") or {}) if w not in leg["machines"])
    if strays:   # HAProxy's X-LLM-Worker names a server the leg had drained: the selection failed
        out["reason"] = "answered by servers outside the leg: %s" % ", ".join(strays)
        out["strays"] = {w: load["workers"][w] for w in strays}
        return out
    out["tok_s"] = _rnd(load["tok_s"], 2)
    out["p50_ms"] = _rnd(load["p50_ms"], 1)
    out["p95_ms"] = _rnd(load["p95_ms"], 1)
    out["ttft_p50_ms"] = _rnd(load.get("ttft_p50_ms"), 1)
    out["ttft_p95_ms"] = _rnd(load.get("ttft_p95_ms"), 1)
    if out["workers_energy"]["joules"]:
        out["tok_j_workers"] = round(load["completion_tokens"] / out["workers_energy"]["joules"], 4)
    if energy["joules"]:
        out["tok_j"] = round(load["completion_tokens"] / energy["joules"], 4)
    elif energy["joules"] == 0:
        out["tok_j_reason"] = "the energy counters did not advance (0 J)"
    else:
        missing = "; ".join("%s: %s" % kv for kv in sorted(energy["missing"].items()))
        out["tok_j_reason"] = "no energy figure: " + (missing or "the leg has no machines")
    return out


def transcode_leg(leg, results, before, after, host=None):
    """A transcode leg: results = {machine: transcode_result()}; fps summed, fps per W summed (the
    host's W included, as for a chat leg)."""
    out = _leg(leg, "transcode", before, after, host)
    energy = out["energy"]
    results = results or {}
    fps = [results.get(m, {}).get("fps") for m in leg["machines"]]
    complete = bool(fps) and all(f is not None for f in fps)
    out.update(runs=results, fps=round(sum(fps), 2) if complete else None, fps_w=None,
               encoders=sorted({r.get("encoder") for r in results.values() if r.get("encoder")}))
    if not complete:
        out["reason"] = "; ".join("%s: %s" % (m, results.get(m, {}).get("reason") or "no result")
                                  for i, m in enumerate(leg["machines"]) if fps[i] is None)
    elif energy["watts"]:
        out["fps_w"] = round(sum(fps) / energy["watts"], 3)
    return out


def scaling(points):
    """points: [(nodes, tok_s or None)]: each with its ratio to the first (one node)."""
    base = points[0][1] if points else None
    return [{"nodes": n, "tok_s": _rnd(t, 2),
             "ratio": round(t / base, 3) if (t is not None and base) else None} for n, t in points]


def build_record(timestamp, params, legs, scaling_legs=(), transcode_legs=(), *, stream_legs=()):
    """The run's record. legs / scaling_legs / stream_legs: chat_leg() records (scaling legs carry
    nodes; stream legs streamed, with their time to first token); transcode_legs: transcode_leg()
    records."""
    everything = list(legs) + list(scaling_legs) + list(transcode_legs) + list(stream_legs)
    record = {
        "format": RECORD_FORMAT,
        "timestamp": timestamp,
        # every machine label a snapshot carried; legs that were not run carry none
        "platform": leg_platform([lab for leg in everything for lab in leg["platforms"].values() if lab]),
        "params": params,
        "legs": list(legs),
        "scaling": {"legs": list(scaling_legs),
                    "curve": scaling([(len(leg["machines"]), leg["tok_s"]) for leg in scaling_legs])},
        "transcode": list(transcode_legs),
        "streaming": list(stream_legs),
        "seed": SEED,
    }
    record["scaling"]["plumbing_check_only"] = any(leg["platform"] != "hardware" for leg in scaling_legs)
    by_name = {leg["name"]: leg for leg in transcode_legs}
    host, both = by_name.get("transcode-host"), by_name.get("transcode-both")
    if host and both and host.get("fps") is not None and both.get("fps") is not None:
        added = {"fps": round(both["fps"] - host["fps"], 2),
                 "percent": round((both["fps"] / host["fps"] - 1) * 100, 1) if host["fps"] else None,
                 "watts": None}
        if host["energy"]["watts"] is not None and both["energy"]["watts"] is not None:
            added["watts"] = round(both["energy"]["watts"] - host["energy"]["watts"], 1)
        record["transcode_card_adds"] = added
    return record


def assemble(timestamp, params, legs, results, frontend):
    """The record from the playbook's raw results: legs as planned ({name, setup, kind, group,
    machines, reason when not run}); results {machine: {leg name: {before, after, load, transcode}}}
    as each machine registered them; frontend: the machine that ran the load generator."""
    main, curve, video, streamed = [], [], [], []
    for leg in legs:
        for key in ("name", "kind", "machines"):
            if key not in leg:
                raise ValueError("leg %r has no %s" % (leg, key))
        charged = list(leg["machines"]) + ([frontend] if frontend and frontend not in leg["machines"] else [])
        mine = {m: ((results or {}).get(m) or {}).get(leg["name"]) or {} for m in charged}
        before = {m: r["before"] for m, r in mine.items() if r.get("before")}
        after = {m: r["after"] for m, r in mine.items() if r.get("after")}
        if leg["kind"] == "transcode":
            runs = {m: r["transcode"] for m, r in mine.items() if r.get("transcode") and m in leg["machines"]}
            video.append(transcode_leg(leg, runs if not leg.get("reason") else {}, before, after, frontend))
            if leg.get("reason"):
                video[-1]["reason"] = leg["reason"]
            continue
        load = None if leg.get("reason") else (((results or {}).get(frontend) or {}).get(leg["name"]) or {}).get("load")
        done = chat_leg(leg, load, before, after, frontend)
        {"scaling": curve, "stream": streamed}.get(leg.get("group"), main).append(done)
    return build_record(timestamp, params, main, curve, video, stream_legs=streamed)
