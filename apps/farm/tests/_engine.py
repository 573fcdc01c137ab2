"""The engine's test bed: a real rabbitmq-server bound to 127.0.0.1 on its own ports (AMQP, Erlang
distribution, epmd) with its data under pytest's tmp dir; real Celery workers and a real coordinator
as subprocesses, each in its own process group; a small HTTP stand-in of smem's lease routes.

Waits are bounded by generous deadlines and poll the state; nothing assumes a speed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(APP / "src"))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from celery import Celery  # noqa: E402
from kombu import Connection  # noqa: E402
from kombu.exceptions import OperationalError  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from farm.broker_users import node_permissions as broker_permissions  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.db import DB  # noqa: E402


def load_settings(values: dict) -> Settings:
    return Settings(**{k: v for k, v in values.items() if v is not None})

PY = sys.executable
RABBIT = next((p for p in ("/usr/lib/rabbitmq/bin/rabbitmq-server",) if os.path.exists(p)), "rabbitmq-server")
# not Debian's /usr/sbin wrapper, which runs it as the rabbitmq user (another Erlang cookie, no access here)
RABBITMQCTL = next((p for p in ("/usr/lib/rabbitmq/bin/rabbitmqctl",) if os.path.exists(p)), "rabbitmqctl")
EPMD = "epmd"
SLOW = float(os.environ.get("FARM_TEST_DEADLINE_SCALE", "1"))   # a slower machine: stretch every deadline
CTL_PIN_LINE = 'CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"'   # roles/farm's rabbitmq-env.conf


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, every: float = 0.1, *, why=None):
    """check() until it returns something true; fail with `what` (and why(), if given) after
    timeout (scaled) seconds."""
    deadline = time.monotonic() + timeout * SLOW
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s%s" % (
                timeout * SLOW, what, "" if why is None else "\n%s" % (why(),)))
        time.sleep(every)


def stop_group(p: subprocess.Popen, sig=signal.SIGTERM, grace: float = 20.0) -> None:
    if p.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def _listeners(ports: set[int]) -> list[tuple[str, int]]:
    """(local address hex, port) of the LISTEN sockets on these ports, IPv4 and IPv6."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, port = local.rsplit(":", 1)
                if state == "0A" and int(port, 16) in ports:
                    found.append((addr, int(port, 16)))
    return found


class Broker:
    def __init__(self, root: Path, conf: str = ""):
        """conf: more rabbitmq.conf lines (the benches set consumer_timeout)."""
        self.root = root
        self.amqp, self.dist, self.epmd_port = free_port(), free_port(), free_port()
        self.url = "amqp://guest:guest@127.0.0.1:%d//" % self.amqp
        (root / "mnesia").mkdir(parents=True)
        (root / "log").mkdir()
        (root / "rabbitmq.conf").write_text(
            "listeners.tcp.default = 127.0.0.1:%d\n"
            "log.console = false\nlog.file.level = warning\n%s" % (self.amqp, conf))
        (root / "enabled_plugins").write_text("[].\n")
        # as roles/farm writes it: rabbitmqctl's own distribution listener on loopback too
        (root / "rabbitmq-env.conf").write_text(CTL_PIN_LINE + "\n")
        self.env = {
            **os.environ,
            "HOME": str(root),                       # its own Erlang cookie
            "RABBITMQ_NODENAME": "farmtest%d@localhost" % self.amqp,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.amqp),
            "RABBITMQ_DIST_PORT": str(self.dist),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(root / "mnesia"), "RABBITMQ_LOG_BASE": str(root / "log"),
            "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(root / "rabbit.pid"),
        }

    def start(self) -> None:
        self.epmd = subprocess.Popen([EPMD, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                                     env=self.env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.log = open(self.root / "server.out", "w")
        self.proc = subprocess.Popen([RABBIT], env=self.env, cwd=self.root, start_new_session=True,
                                     stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("rabbitmq-server exited:\n" + (self.root / "server.out").read_text()[-3000:])
            try:
                with Connection(self.url, connect_timeout=2) as c:
                    c.ensure_connection(max_retries=1)
                return True
            except Exception:
                return False
        wait_for("rabbitmq-server on 127.0.0.1:%d" % self.amqp, up, 120, every=0.5)

    def ctl_argv(self, *args: str) -> list[str]:
        return [RABBITMQCTL, "-n", self.env["RABBITMQ_NODENAME"], *args]

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        """rabbitmqctl against this broker (its rabbitmq-env.conf pins the CLI's listener to loopback)."""
        return subprocess.run(self.ctl_argv(*args), env=self.env, capture_output=True, text=True,
                              timeout=120 * SLOW, check=False)

    def add_node_users(self, settings: dict, nodes: list[str], password: str = "node-test-password") -> dict:
        """One broker user per node with the role's permissions (farm.broker_users), in one rabbitmqctl call;
        {node: its amqp URL}."""
        s = load_settings(settings)
        salt = secrets.token_bytes(4)
        digest = base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()
        users = [{"name": s.node_user(n), "password_hash": digest, "tags": [],
                  "hashing_algorithm": "rabbit_password_hashing_sha256"} for n in nodes]
        perms = [{"user": s.node_user(n), "vhost": "/", **broker_permissions(s, n)} for n in nodes]
        path = self.root / ("definitions-%s.json" % secrets.token_hex(4))
        path.write_text(json.dumps({"users": users, "permissions": perms}))
        r = self.ctl("import_definitions", str(path))
        assert r.returncode == 0, r.stdout + r.stderr
        return {n: "amqp://%s:%s@127.0.0.1:%d//" % (s.node_user(n), password, self.amqp) for n in nodes}

    def stop(self) -> None:
        for p in (getattr(self, "proc", None), getattr(self, "epmd", None)):
            if p is not None:
                stop_group(p, grace=30)
        if getattr(self, "log", None):
            self.log.close()


_broker: list[Broker] = []


@pytest.fixture(scope="session", name="broker")
def broker_fixture(tmp_path_factory):
    """One broker for the session: each test module imports this fixture, and pytest would
    otherwise start one per module."""
    if not _broker:
        b = Broker(tmp_path_factory.mktemp("rabbitmq"))
        _broker.append(b)
        try:
            b.start()
        except BaseException:
            b.stop()
            raise
    yield _broker[0]
    _broker[0].stop()      # at the session's end (a second call finds it stopped)


class Farm:
    """One test's farm: its settings file, workers, coordinator. Unique node names and reports queue
    per test, so broadcasts and reports never cross tests on the shared broker."""

    def __init__(self, broker: Broker, root: Path, tag: str, **settings):
        self.broker, self.root, self.tag = broker, root, tag
        root.mkdir(parents=True, exist_ok=True)
        self.nodes = ["%s-node%d" % (tag, i) for i in range(3)]
        self.settings = {
            "broker_url": broker.url, "reports_queue": "farm.reports." + tag,
            "db_path": str(root / "farm.db"), "parts_dir": str(root / "parts"), "work_dir": str(root / "work"),
            "output_dir": str(root / "out"), "farm_nodes": self.nodes, "never_lend": [tag + "-node2x"],
            "min_chunk": 10, "per_node": 4, "progress_interval_s": 0.5, "reconcile_interval_s": 2.0,
            "poll_interval_s": 0.2, "failure_backoff_s": 1.5, "excuse_wait_s": 3.0, "min_free_gib": 0.1,
            "lease_ttl_s": 30.0, "lease_renew_s": 2.0, "lease_retry_s": 1.0,
            **settings,
        }
        self.config = root / "farm.toml"
        self.write_config()
        self.node_urls = broker.add_node_users(self.settings, self.nodes)
        self.control = Celery("farm-test", broker=broker.url).control   # ping, inspect: this test's own
        self.workers: dict[str, subprocess.Popen] = {}
        self.coordinator: subprocess.Popen | None = None
        self.api: subprocess.Popen | None = None
        self.api_url: str | None = None
        self._db = None

    def write_config(self) -> None:
        write_toml(self.config, self.settings)

    def node_url(self, node: str) -> str:
        """The node's own broker user (made once), as the role makes one per node."""
        if node not in self.node_urls:
            self.node_urls.update(self.broker.add_node_users(self.settings, [node]))
        return self.node_urls[node]

    def worker_config(self, node: str, **overrides) -> Path:
        """A worker's own settings file: the farm's, its own broker user, and overrides."""
        path = self.root / ("farm-%s.toml" % node)
        write_toml(path, {**self.settings, "broker_url": self.node_url(node), **overrides})
        return path

    def remote_worker_config(self, node: str, **overrides) -> Path:
        """A worker that shares no directory with the host (host_url): parts and cache of its own."""
        own = self.root / node
        return self.worker_config(node, host_url=self.api_url, worker_token_file=str(self.root / "worker-token"),
                                  parts_dir=str(own / "parts"), cache_dir=str(own / "cache"), **overrides)

    def start_api(self) -> str:
        """`farm api` on a free loopback port, both tokens; host_url set for the workers."""
        port = free_port()
        (self.root / "api-token").write_text("api-test-token\n")
        (self.root / "worker-token").write_text("worker-test-token\n")
        self.api_url = "http://127.0.0.1:%d" % port
        self.settings.update(api_listen="127.0.0.1:%d" % port, api_token_file=str(self.root / "api-token"),
                             worker_token_file=str(self.root / "worker-token"))
        self.write_config()
        log = open(self.root / "api.log", "a")
        self.api = subprocess.Popen([PY, "-m", "farm", "api"], env=self.env(), cwd=self.root,
                                    start_new_session=True, stdout=log, stderr=subprocess.STDOUT)

        def up():
            if self.api.poll() is not None:
                raise AssertionError("farm api exited:\n" + self.log("api.log"))
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.api_url + "/v1/jobs", headers={"Authorization": "Bearer api-test-token"},
                                 timeout=2).status_code == 200
        wait_for("farm api on %s" % self.api_url, up, 60, every=0.2)
        return self.api_url

    @property
    def db(self) -> DB:
        if self._db is None:
            self._db = DB(self.settings["db_path"])
        return self._db

    def env(self, **extra) -> dict:
        return {**os.environ, "PYTHONPATH": str(APP / "src"), "FARM_CONFIG": str(self.config),
                "PYTHONUNBUFFERED": "1", **extra}

    def start_worker(self, node: str, config: Path | None = None, **env) -> subprocess.Popen:
        log = open(self.root / ("worker-%s.log" % node), "a")
        env["FARM_CONFIG"] = str(config or self.worker_config(node))
        p = subprocess.Popen([PY, str(APP / "tests" / "worker_main.py"), "--node", node, "--loglevel", "INFO"],
                             env=self.env(**env), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.workers[node] = p
        return p

    def start_workers(self, nodes=None, **env) -> None:
        nodes = nodes or self.nodes
        for n in nodes:
            self.start_worker(n, **env)
        self.wait_workers(nodes)

    def wait_workers(self, nodes) -> None:
        want = {"farm@" + n for n in nodes}

        def answered():
            for n, p in self.workers.items():
                if n in nodes and p.poll() is not None:
                    raise AssertionError("worker %s exited:\n%s" % (n, self.log("worker-%s.log" % n)))
            try:
                got = {k for r in self.control.ping(destination=sorted(want), timeout=1.0) for k in r}
            except OperationalError:    # a connect that timed out on a busy machine: ask again, in time
                return False
            return want <= got
        wait_for("workers %s to answer a ping" % sorted(want), answered, 90, every=0.2)

    def active_queues(self) -> dict | None:
        """{worker: the queues it consumes} of this farm's workers that answered; None when the connect
        timed out (a busy machine): the caller's wait_for asks again."""
        try:
            return self.control.inspect(destination=["farm@" + n for n in self.nodes], timeout=2).active_queues()
        except OperationalError:
            return None

    def start_coordinator(self, **env) -> subprocess.Popen:
        """`farm coordinator`; with env (its faults, see coordinator_main.py) the tests' wrapper of it."""
        log = open(self.root / "coordinator.log", "a")
        argv = [str(APP / "tests" / "coordinator_main.py")] if env else ["-m", "farm", "coordinator"]
        self.coordinator = subprocess.Popen([PY, *argv], env=self.env(**env), cwd=self.root,
                                            start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        return self.coordinator

    def farm(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        """The CLI, as a user runs it."""
        return subprocess.run([PY, "-m", "farm", *args], env=self.env(), capture_output=True, text=True,
                              timeout=timeout * SLOW, check=False)

    def submit(self, frames: int = 120, *, verify: bool = False, nodes=None, fps: int = 30, out: str | None = None,
               **extra) -> str:
        """A testsrc job (extra: more of the spec), detached; its id. Each job its own output, by default
        (the farm refuses a second live job writing the same one)."""
        if out is None:
            self.submitted = getattr(self, "submitted", 0) + 1
            out = "job.mp4" if self.submitted == 1 else "job-%d.mp4" % self.submitted
        spec = self.root / "spec.json"
        spec.write_text(json.dumps({"renderer": "testsrc", "width": 320, "height": 180, "fps": fps,
                                    "frames": frames, **extra}))
        args = ["submit", "--spec", str(spec), "--out", str(self.root / "out" / out), "--detach",
                "--nodes", *(nodes or self.nodes)]
        r = self.farm(*args, *(["--verify"] if verify else []))
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    def job(self, job_id: str) -> dict:
        return self.db.job(job_id)

    def wait_state(self, job_id: str, states, timeout: float = 120) -> dict:
        """The job once in one of states (a final one: with its nodes given back, as the end does)."""
        states = (states,) if isinstance(states, str) else states

        def reached():
            if self.coordinator is not None and self.coordinator.poll() is not None:
                raise AssertionError("coordinator exited:\n" + self.log("coordinator.log"))
            j = self.job(job_id)
            released = j["nodes_released"] or j["state"] not in ("done", "failed", "cancelled")
            return j if j["state"] in states and released else None
        def why():
            j = self.job(job_id)
            events = "\n".join("  %.1f %s" % (e["at"], e["text"]) for e in self.db.view(job_id)["events"][-15:])
            return "state %s, nodes_released %s; its last events:\n%s\ncoordinator log (tail):\n%s" % (
                j["state"], j["nodes_released"], events, self.log("coordinator.log")[-3000:])
        return wait_for("job %s to be %s" % (job_id, "/".join(states)), reached, timeout, why=why)

    def attempts(self, job_id: str) -> list[dict]:
        return self.db.rows("SELECT * FROM attempts WHERE job_id=? ORDER BY idx, n", (job_id,))

    def log(self, name: str) -> str:
        p = self.root / name
        return p.read_text()[-6000:] if p.exists() else ""

    def close(self) -> None:
        for p in self.workers.values():
            stop_group(p, signal.SIGKILL if p.poll() is None and _stopped(p) else signal.SIGTERM)
        for p in (self.coordinator, self.api):
            if p is not None:
                stop_group(p)


def write_toml(path: Path, settings: dict) -> None:
    """JSON is TOML for strings, numbers, booleans and lists; a dict becomes an inline table."""
    def value(v):
        if isinstance(v, dict):
            return "{%s}" % ", ".join("%s = %s" % (json.dumps(k), value(x)) for k, x in v.items())
        return json.dumps(v)
    path.write_text("".join("%s = %s\n" % (k, value(v)) for k, v in settings.items() if v is not None))


def processes_naming(marker: str) -> list[str]:
    """The command lines of the live processes (zombies have none) whose argv contains marker."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open("/proc/%s/cmdline" % pid, "rb") as f:
            line = f.read().replace(b"\0", b" ").decode(errors="replace")
            if marker in line and int(pid) != os.getpid():
                found.append(line)
    return found


def _stopped(p: subprocess.Popen) -> bool:
    """A SIGSTOPped worker ignores SIGTERM until continued: kill it."""
    with contextlib.suppress(FileNotFoundError):
        return open("/proc/%d/stat" % p.pid).read().split(")")[1].split()[0] == "T"
    return False


_tags = itertools.count()


@pytest.fixture(name="make_farm")
def make_farm_fixture(broker, tmp_path):
    farms = []

    def make(**settings) -> Farm:
        f = Farm(broker, tmp_path / ("farm%d" % len(farms)), "t%d" % next(_tags), **settings)
        farms.append(f)
        return f
    yield make
    for f in farms:
        f.close()


# -- frames, by hash --------------------------------------------------------------------------------
def assert_every_chunk_once(farm, job_id):
    """Done, verified, and the output's frames are the parts' frames, each index exactly once, in order."""
    job = farm.job(job_id)
    assert job["state"] == "done", (job["state"], job["reason"], farm.log("coordinator.log"))
    assert job["result"]["verify"]["ok"], job["result"]["verify"]
    chunks = farm.db.rows("SELECT * FROM chunks WHERE job_id=? ORDER BY idx", (job_id,))
    assert [c["state"] for c in chunks] == ["done"] * len(chunks)
    parts = farm.root / "parts"
    want = []
    for c in chunks:
        hashes = frame_hashes(parts / c["video"])
        assert len(hashes) == c["last"] - c["first"] + 1
        want += hashes
    got = frame_hashes(job["out"])
    assert len(got) == job["frames"] and got == want
    return chunks


def frame_hashes(path: Path) -> list[str]:
    """md5 of each decoded video frame, in order."""
    out = subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-map", "0:v:0", "-f", "framemd5", "-"],
                         capture_output=True, text=True, check=True).stdout
    return [line.rsplit(",", 1)[1].strip() for line in out.splitlines() if line and not line.startswith("#")]


# -- a stand-in of smem's lease routes ----------------------------------------------------------------
class LeaseStandIn:
    """POST/GET /v5/admin/leases, DELETE /v5/admin/leases/{id}, as smem answers them (201, 409, 404,
    403 without the admin token), on 127.0.0.1. `calls` records every request. patch=True adds the
    renew route (PATCH {ttlSeconds}) that smem has; without it, the 405 of an smem from before it.
    hold: seconds to hold the answer of each of the first POSTs, the lease recorded first (as smem does
    while it drains the nodes' calls in flight)."""

    TOKEN = "admin-test-token"

    def __init__(self, nodes: list[str] | None = None, *, patch: bool = False, hold: list[float] = ()):
        self.nodes, self.leases, self.calls, self.n, self.hold = nodes, {}, [], 0, list(hold)
        lock = threading.Lock()

        def live():
            now = time.time()
            return {k: v for k, v in self.leases.items() if v["until"] > now and not v.get("released")}

        async def create(request):
            body = await request.json()
            self.calls.append(("POST", body))
            if request.headers.get("authorization") != "Bearer " + self.TOKEN:
                return JSONResponse({"error": "admin token required"}, status_code=403)
            with lock:
                unknown = set(body["nodes"]) - set(self.nodes or body["nodes"])
                if unknown:
                    return JSONResponse({"error": "unknown node(s): %s" % sorted(unknown)}, status_code=400)
                for lease in live().values():
                    if set(lease["nodes"]) & set(body["nodes"]):
                        return JSONResponse({"error": "node(s) already leased by %s" % lease["holder"]},
                                            status_code=409)
                self.n += 1
                until = time.time() + body["ttlSeconds"]
                lease = {"id": "lse_%d" % self.n, "nodes": sorted(body["nodes"]), "holder": body["holder"],
                         "until": until, "expiresAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(until))}
                self.leases[lease["id"]] = lease
                held = self.hold.pop(0) if self.hold else 0
            if held:
                await asyncio.sleep(held)
            return JSONResponse({**self._public(lease), "drained": True}, status_code=201)

        async def renew(request):
            lid = request.path_params["id"]
            body = await request.json()
            self.calls.append(("PATCH", lid))
            with lock:
                lease = live().get(lid)
                if lease is None:
                    return JSONResponse({"error": "no live lease %s" % lid}, status_code=404)
                lease["until"] = time.time() + body["ttlSeconds"]
                lease["expiresAt"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(lease["until"]))
            return JSONResponse(self._public(lease))

        async def listing(request):
            self.calls.append(("GET", None))
            return JSONResponse({"leases": [self._public(v) for v in live().values()]})

        async def delete(request):
            lid = request.path_params["id"]
            self.calls.append(("DELETE", lid))
            with lock:
                lease = live().get(lid)
                if lease is None:
                    return JSONResponse({"error": "no live lease %s" % lid}, status_code=404)
                lease["released"] = True
            return JSONResponse({**self._public(lease), "released": True})

        routes = [Route("/v5/admin/leases", create, methods=["POST"]),
                  Route("/v5/admin/leases", listing, methods=["GET"]),
                  Route("/v5/admin/leases/{id}", delete, methods=["DELETE"])]
        if patch:
            routes.append(Route("/v5/admin/leases/{id}", renew, methods=["PATCH"]))
        app = Starlette(routes=routes)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for("the lease stand-in", lambda: self.server.started, 30)

    @staticmethod
    def _public(v: dict) -> dict:
        return {k: v[k] for k in ("id", "nodes", "holder", "expiresAt")}

    def live(self) -> list[dict]:
        now = time.time()
        return [v for v in self.leases.values() if v["until"] > now and not v.get("released")]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(name="smem")
def smem_fixture(tmp_path):
    """A lease stand-in and its admin token file."""
    s = LeaseStandIn()
    s.token_file = tmp_path / "smem-admin-token"
    s.token_file.write_text(LeaseStandIn.TOKEN + "\n")
    yield s
    s.stop()
