"""Settings: defaults, overridden by a TOML file (`--config FILE`, else $FARM_CONFIG). Unknown keys are an error."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

try:
    import tomllib
except ImportError:  # the nodes' Python 3.10
    import tomli as tomllib

NEVER_LENT = "vca-node2"
FARM_NODES = ["vca-node0", "vca-node1", "vca-node4", "vca-node5"]   # inventory group `farm`


@dataclass
class Settings:
    broker_url: str = "amqp://farm:farm@127.0.0.1:5672/farm"
    broker_heartbeat: int = 6             # a hung node's chunk is re-queued after two to three of these
    reports_queue: str = "farm.reports"   # workers -> coordinator: started / progress / done / failed / lost
                                          # (through a direct exchange of the same name)
    node_user_prefix: str = "farm-"       # node N's broker user is farm-N: a report's node must be the one its
                                          # broker-validated user_id names (README "One broker user per node")
    db_path: str = "/var/lib/farm/farm.db"            # job state, on the host
    work_dir: str = "/var/lib/farm/work"              # scratch (bundles, temporaries)
    output_dir: str = "/var/lib/farm/out"             # where `farm submit` puts outputs given without a directory
    parts_dir: str = "/srv/farm/parts"                # on the host: parts land in parts_dir/<job>/ (shared with
                                                      # the nodes unless host_url: then uploaded)
    host_url: str | None = None           # the farm API as the workers reach it (http://172.31.1.254:8790): bundles
                                          # fetched by hash, parts uploaded; None: host and nodes share the dirs
    worker_token_file: str | None = None  # the workers' bearer token (bundles and parts only)
    cache_dir: str = "/var/cache/farm"    # a worker's own: bundles/<hash>, parts/<job>/ before upload
    bundle_cache_keep: int = 4            # bundles a worker keeps (least recently used go first)
    attempts: int = 3                     # per chunk, every delivery that started or was lost counts
    blocklist_after: int = 3              # a node failing this many chunks of one job is blocklisted for it
    lost_hold_s: float = 1.0              # a worker that reports a lost chunk waits this long before its next
                                          # message: the retry, at the queue's front by then, comes to it
    failure_backoff_s: float = 5.0        # a node whose render failed waits before it takes another chunk: the
                                          # retry goes elsewhere, and a broken node does not eat the queue
    avoid_hold_s: float = 1.0             # a worker given a retry it should avoid puts it back, then waits this
                                          # long before its next message (another worker takes it meanwhile)
    lease_ttl_s: float = 120.0
    lease_renew_s: float = 30.0
    lease_retry_s: float = 10.0           # a job whose nodes are leased elsewhere (409) asks again after this
    smem_url: str | None = None           # absent: no leases (the farm uses its group's nodes and says so)
    smem_token_file: str | None = None    # smem's admin token
    farm_nodes: list = field(default_factory=lambda: list(FARM_NODES))
    never_lend: list = field(default_factory=lambda: ["vca-node2"])
    min_chunk: int = 30                   # frames; farm.plan.plan_chunks
    per_node: int = 4                     # chunks per node
    progress_interval_s: float = 2.0      # a rendering chunk reports this often
    stale_after_s: float = 30.0           # a chunk silent this long shows as stale, not "rendering"
    silent_after_s: float = 90.0          # an attempt silent this long is given up: revoked, the next one published
    poll_interval_s: float = 0.5
    reconcile_interval_s: float = 10.0    # add_consumer is re-sent this often (a restarted worker missed it)
    control_timeout_s: float = 2.0        # replies to add_consumer / cancel_consumer / ping
    api_listen: str = "127.0.0.1:8790"   # farm api
    api_token_file: str | None = None     # its bearer token (required)
    allow_public_listen: bool = False     # an api_listen on every address (0.0.0.0, ::, a name resolving to one)
                                          # needs this, explicitly
    render: dict = field(default_factory=dict)   # the media half's knobs (browser, node, ...); on a worker, its
                                                 # node, browser, node_modules, concurrency replace the job's

    def __post_init__(self):
        if self.attempts < 1 or self.blocklist_after < 1:
            raise ValueError("attempts and blocklist_after must be >= 1")
        if self.lease_renew_s >= self.lease_ttl_s:
            raise ValueError("lease_renew_s must be shorter than lease_ttl_s")
        if self.silent_after_s <= 2 * self.progress_interval_s:
            raise ValueError("silent_after_s must be longer than two progress_interval_s")
        if self.bundle_cache_keep < 1:
            raise ValueError("bundle_cache_keep must be >= 1")
        # Node 2 keeps smem's interactive lane whole: a config may add to the list, never drop it.
        self.never_lend = sorted(set(self.never_lend) | {NEVER_LENT})

    @property
    def lendable(self) -> list[str]:
        return [n for n in self.farm_nodes if n not in self.never_lend]

    def node_user(self, node: str) -> str:
        return self.node_user_prefix + node

    def worker_token(self) -> str | None:
        return Path(self.worker_token_file).read_text().strip() if self.worker_token_file else None

    def smem_token(self) -> str | None:
        if not (self.smem_url and self.smem_token_file):
            return None
        return Path(self.smem_token_file).read_text().strip()


def load(path: str | os.PathLike | None = None, **overrides) -> Settings:
    path = path or os.environ.get("FARM_CONFIG")
    data = {}
    if path:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    data.update(overrides)
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError("%s: unknown key %s" % (path or "settings", ", ".join(unknown)))
    return Settings(**data)
