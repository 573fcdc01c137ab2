"""Settings: defaults, overridden by a TOML file (`--config FILE`, else $FARM_CONFIG). Unknown keys are an error."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

try:
    import tomllib
except ImportError:  # the nodes' Python 3.10
    import tomli as tomllib

FARM_NODES = ["vca-node0", "vca-node1", "vca-node4", "vca-node5"]   # inventory group `farm`
# One node's render seconds per frame. remotion: the seeds' episode, 15,474 frames in 363 s on one card's
# three nodes (0.0704 s a frame a node). testsrc: ffmpeg's test pattern at a test's tiny size (an upper
# bound of `bench/farm_long.py` on the lab).
RENDER_S_PER_FRAME = {"remotion": 0.0704, "testsrc": 0.005}
WORKER_KEYS = ("node", "browser", "node_modules", "concurrency")   # a machine's own executables, never a job's
HARD_LIMIT_GRACE_S = 30.0   # after the soft limit: the render's tools stopped and its report sent


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
    worker_token_file: str | None = None  # a worker's bearer token (bundles and parts only): on a node, its own
    worker_tokens_dir: str | None = None  # on the host: <node>.token for each node, each node's own token
    metrics_token_file: str | None = None  # a Prometheus scrape's bearer token (GET /metrics only)
    cache_dir: str = "/var/cache/farm"    # a worker's own: bundles/<hash>, parts/<job>/ before upload
    bundle_cache_keep: int = 4            # bundles a worker keeps (least recently used go first)
    attempts: int = 3                     # per chunk, every delivery that started or was lost counts
    interrupted_report_s: float = 600.0   # a worker that lost the broker mid-render says so for this long
    excused_attempts: int = 10            # more re-runs of a chunk that are nobody's fault (broker restarts)
    outage_grace_s: float = 60.0          # a re-delivery this soon after the coordinator's own broker connection
                                          # came back is the broker's doing (README "Whose fault")
    excuse_wait_s: float = 30.0           # a re-delivery with no excuse yet waits this long for its node's word
                                          # (`interrupted`: its link failed) before it is charged to the node
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
    lease_call_timeout_s: float = 10.0    # smem's renew, release and list answer at once: this long at most
    lease_take_timeout_s: float = 150.0   # smem answers a take once the nodes' calls in flight are done (up to a
                                          # lane's timeout_s, 120 s): the coordinator's loop never waits for it
    lease_sweep_s: float = 60.0           # smem's leases for a farm job that farm.db does not hold are released
                                          # this often (and after a take that timed out, and at start)
    smem_url: str | None = None           # absent: no leases (the farm uses its group's nodes and says so)
    smem_token_file: str | None = None    # smem's admin token
    farm_nodes: list = field(default_factory=lambda: list(FARM_NODES))
    never_lend: list = field(default_factory=list)   # nodes the farm never borrows (the inventory's farm_never_lend)
    min_chunk: int = 30                   # frames; farm.plan.plan_chunks
    per_node: int = 4                     # chunks per node
    # A chunk's size comes from its estimated render time (README "Long jobs"): a long video gets more
    # chunks, never longer ones, and each chunk's time limits and the broker's consumer_timeout follow.
    chunk_target_s: float = 300.0         # a chunk's estimated render time on one node, at most
    render_s_per_frame: dict = field(default_factory=lambda: dict(RENDER_S_PER_FRAME))   # the estimate, by
                                          # renderer (one node); a job's spec may carry its own s_per_frame
    chunk_limit_factor: float = 4.0       # a chunk is given up as too slow at floor + factor x its frames x the
    chunk_limit_floor_s: float = 120.0    #   job's measured seconds per frame (README "Time limits that learn")
    chunk_limit_cap_s: float = 3600.0     # and never later than this: the workers' own time limit (Celery's soft
                                          # limit; the hard one HARD_LIMIT_GRACE_S later)
    speed_sample_frames: int = 10         # a render's speed counts once it has rendered this many frames
    broker_consumer_timeout_s: float = 3930.0   # RabbitMQ's consumer_timeout, as the role sets it from the same
                                          # bound: every chunk's hard limit must end before it
    progress_interval_s: float = 2.0      # a rendering chunk reports this often
    stale_after_s: float = 30.0           # a chunk silent this long shows as stale, not "rendering"
    stall_after_s: float = 120.0          # a render whose parts grow by no byte this long is hung: given up, revoked
    silent_after_s: float = 90.0          # an attempt silent this long is given up: revoked, the next one published
    join_workers: int = 2                 # joins (and their verify) at once, each a process of its own
    join_attempts: int = 3                # a join that fails (or runs past its timeout) is run again, this many in all
    join_backoff_s: float = 30.0          # before the second attempt; doubled before each next one
    join_timeout_factor: float = 1.0      # a join is killed (a failed attempt) after floor + factor x the job's
    join_timeout_floor_s: float = 600.0   #   length in seconds (frames / fps)
    poll_interval_s: float = 0.5
    report_retry_s: float = 1.0           # a report that could not be applied goes back to the queue after this
    report_tries: int = 30                # and is dropped (logged) after this many failed applies
    reconcile_interval_s: float = 10.0    # add_consumer is re-sent this often (a restarted worker missed it)
    control_timeout_s: float = 2.0        # replies to add_consumer / cancel_consumer / ping
    keep_parts_h: float = 48.0            # `farm gc`: a job's parts and verify files, this long after its end
    keep_failed_parts_h: float = 720.0    #   a failed job's (`farm join JOB` may join them again): 30 days, or
                                          #   until `farm gc --job JOB`
    keep_bundles_h: float = 168.0         # a bundle no job used this long
    keep_records_h: float = 2160.0        # a job's rows in the database and its join log, this long after its end
    temp_max_age_h: float = 6.0           # temporaries (half-written parts, a killed join's), this old
    max_part_bytes: int = 4 * 2**30       # an upload larger than this is refused (413)
    min_free_gib: float = 2.0             # a submit is refused when parts_dir or output_dir has less free, or
                                          # would have less once the job's parts and output are written
    part_bytes_per_pixel: float = 0.15    # the estimate of a job's video size: bytes per pixel per frame (H.264
                                          # at Remotion's default CRF 18 stays well under this), for the above
    space_check_s: float = 30.0           # a job paused for lack of space on the host looks again this often
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
        if self.stall_after_s <= 2 * self.progress_interval_s:
            raise ValueError("stall_after_s must be longer than two progress_interval_s")
        if self.silent_after_s <= 2 * self.progress_interval_s:
            raise ValueError("silent_after_s must be longer than two progress_interval_s")
        self._check_joins()
        if self.bundle_cache_keep < 1:
            raise ValueError("bundle_cache_keep must be >= 1")
        if self.chunk_target_s <= 0 or self.chunk_limit_factor < 1 or self.chunk_limit_floor_s < 0:
            raise ValueError("chunk_target_s must be > 0, chunk_limit_factor >= 1, chunk_limit_floor_s >= 0")
        if any(not isinstance(v, (int, float)) or v <= 0 for v in self.render_s_per_frame.values()):
            raise ValueError("render_s_per_frame: seconds per frame, each > 0: %r" % (self.render_s_per_frame,))
        if self.chunk_limit_cap_s <= self.chunk_limit_floor_s:
            raise ValueError("chunk_limit_cap_s (%g) must be longer than chunk_limit_floor_s (%g)"
                             % (self.chunk_limit_cap_s, self.chunk_limit_floor_s))
        if self.report_tries < 1:
            raise ValueError("report_tries must be >= 1")
        if self.speed_sample_frames < 1 or self.part_bytes_per_pixel <= 0 or self.space_check_s <= 0:
            raise ValueError("speed_sample_frames must be >= 1, part_bytes_per_pixel and space_check_s > 0")
        longest = self.hard_limit_s()
        if self.temp_max_age_h * 3600 <= longest:
            raise ValueError("temp_max_age_h must be longer than a chunk's hard limit (%g s): a render's"
                             " temporaries would be pruned under it" % longest)
        if longest >= self.broker_consumer_timeout_s:
            raise ValueError("a chunk may run %g s (chunk_limit_cap_s %g, then its hard limit), not shorter than"
                             " the broker's consumer_timeout (broker_consumer_timeout_s %g s): the broker would"
                             " take it back mid-render" % (longest, self.chunk_limit_cap_s,
                                                           self.broker_consumer_timeout_s))

    def _check_joins(self) -> None:
        if self.join_attempts < 1 or self.join_timeout_factor <= 0 or self.join_timeout_floor_s <= 0:
            raise ValueError("join_attempts must be >= 1, join_timeout_factor and join_timeout_floor_s > 0")

    @property
    def lendable(self) -> list[str]:
        return [n for n in self.farm_nodes if n not in self.never_lend]

    def s_per_frame(self, spec: dict) -> float:
        """The job's own estimate (its spec's s_per_frame), else its renderer's."""
        own = spec.get("s_per_frame")
        if own is not None:
            if not isinstance(own, (int, float)) or isinstance(own, bool) or own <= 0:
                raise ValueError("s_per_frame is seconds per frame, > 0, not %r" % (own,))
            return float(own)
        return float(self.render_s_per_frame.get(spec.get("renderer") or "remotion",
                                                 max(self.render_s_per_frame.values())))

    def max_chunk(self, spec: dict) -> int:
        """The most frames one chunk may have: chunk_target_s of render time at the estimate."""
        return max(1, int(self.chunk_target_s / self.s_per_frame(spec)))

    def time_limit_s(self, frames: int, s_per_frame: float) -> float:
        """When the coordinator gives a render of that many frames up as too slow, at that speed."""
        return min(self.chunk_limit_cap_s, self.chunk_limit_floor_s + self.chunk_limit_factor * frames * s_per_frame)

    def hard_limit_s(self) -> float:
        return self.chunk_limit_cap_s + HARD_LIMIT_GRACE_S

    def worker_limits(self) -> tuple[float, float]:
        """(soft, hard) Celery time limits every chunk goes out with: the cap, a backstop for a coordinator
        that is away; the limit that follows the job's speed is the coordinator's (time_limit_s)."""
        return self.chunk_limit_cap_s, self.hard_limit_s()

    def job_bytes(self, spec: dict) -> int:
        """The estimated bytes a job writes on the host: its video parts, PCM parts and the output (the
        video once more, and its audio)."""
        frames, fps = spec["frames"], float(spec["fps"])
        video = frames * spec.get("width", 1920) * spec.get("height", 1080) * self.part_bytes_per_pixel
        pcm = frames / fps * spec.get("sample_rate", 48000) * 2 * 2
        return int(2 * video + pcm + frames / fps * 32000)

    def node_user(self, node: str) -> str:
        return self.node_user_prefix + node

    def worker_token(self) -> str | None:
        return Path(self.worker_token_file).read_text().strip() if self.worker_token_file else None

    def node_tokens(self) -> dict[str, str]:
        """Each node's own worker token, by node (worker_tokens_dir/<node>.token)."""
        if not self.worker_tokens_dir:
            return {}
        return {f.stem: f.read_text().strip() for f in sorted(Path(self.worker_tokens_dir).glob("*.token"))}

    def metrics_token(self) -> str | None:
        return Path(self.metrics_token_file).read_text().strip() if self.metrics_token_file else None

    def smem_token(self) -> str | None:
        if not (self.smem_url and self.smem_token_file):
            return None
        return Path(self.smem_token_file).read_text().strip()


def worker_spec(spec: dict, settings: Settings) -> dict:
    """The job's spec with this machine's own executables (its settings' [render]): they are the node's,
    or the host's, not the job's."""
    own = settings.render or {}
    return {**spec, **{k: own[k] for k in WORKER_KEYS if k in own}}


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
