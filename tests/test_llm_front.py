"""roles/llm_workers' HAProxy configuration (templates/haproxy.cfg.j2, rendered with the role's defaults)
run by Debian's haproxy on loopback, in front of two stand-in workers (fixtures/llm_worker_stub.py on
127.0.0.2 and 127.0.0.3): a worker that hangs mid-stream (SIGSTOP, as a node that froze) releases its
client within 10 s, not after timeout server; a request it had not answered yet is answered by the
other worker; a drained worker stays drained across a reload (server-state-file)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ROLE = ROOT / "roles" / "llm_workers"
STUB = Path(__file__).resolve().parent / "fixtures" / "llm_worker_stub.py"
STATUS = ROLE / "files" / "llm-workers-status"
WORKERS = {"w0": "127.0.0.2", "w1": "127.0.0.3"}
TOKEN = "front-token"


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def render(tmp_path: Path, **overrides) -> tuple[str, dict]:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    port = free_port(WORKERS["w0"])
    variables = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
    variables.update(
        ansible_managed="test", llm_workers_marker="vcafleet llm_workers", llm_workers_workers=list(WORKERS),
        llm_workers_addresses=WORKERS, llm_workers_port=port, hostvars={w: {} for w in WORKERS},
        llm_workers_token=TOKEN, llm_workers_listen_port=free_port(), llm_workers_metrics_port=free_port(),
        llm_workers_admin_socket=str(tmp_path / "admin.sock"),
        llm_workers_server_state_file=str(tmp_path / "servers.state"),
        llm_workers_keys_map=str(tmp_path / "keys.map"), llm_workers_clients_file=str(tmp_path / "clients.lst"),
        llm_workers_metrics_clients_file=str(tmp_path / "metrics-clients.lst"))
    variables.update(overrides)
    (tmp_path / "keys.map").write_text("".join(f"{w} key-{w}\n" for w in WORKERS))
    (tmp_path / "clients.lst").write_text(f"Bearer {TOKEN}\n")
    (tmp_path / "metrics-clients.lst").write_text("Bearer metrics\n")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.from_string((ROLE / "templates" / "haproxy.cfg.j2").read_text()).render(**variables)
    if os.getuid() != 0:        # only root can become user haproxy; the rest is as shipped
        text = "\n".join(line for line in text.splitlines() if line.strip() not in ("user haproxy", "group haproxy"))
    return text, variables


class Front:
    """haproxy -W (master-worker, as Debian's unit runs it) with the rendered configuration."""

    def __init__(self, tmp_path: Path, config: str, variables: dict):
        self.tmp, self.v = tmp_path, variables
        self.cfg = tmp_path / "haproxy.cfg"
        self.cfg.write_text(config)
        check = subprocess.run([haproxy(), "-c", "-q", "-f", str(self.cfg)], capture_output=True, text=True,
                               check=False)
        assert check.returncode == 0, check.stderr
        self.p = subprocess.Popen([haproxy(), "-W", "-db", "-f", str(self.cfg)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        self.wait_for_socket()

    @property
    def sock(self) -> str:
        return self.v["llm_workers_admin_socket"]

    def wait_for_socket(self):
        deadline = time.monotonic() + 30
        while True:
            try:
                if "llm_workers" in self.ask("show stat"):
                    return
            except OSError:
                pass
            assert self.p.poll() is None, "haproxy exited"
            assert time.monotonic() < deadline, "haproxy never answered on its admin socket"
            time.sleep(0.1)

    def ask(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.sock)
            s.sendall(command.encode() + b"\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data.decode()

    def status(self, *args: str) -> dict:
        return json.loads(subprocess.run([sys.executable, str(STATUS), *args, self.sock], capture_output=True,
                                         text=True, check=True, timeout=30).stdout)

    def wait_until(self, predicate, what: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while not predicate(states := self.status()):
            assert time.monotonic() < deadline, f"{what}: HAProxy says {states}"
            time.sleep(0.2)
        return states

    def reload(self, save: bool = True):
        """What the role's unit does on a reload: save the servers' states, then USR2 to the master."""
        if save:
            subprocess.run([sys.executable, str(STATUS), "--save-state", self.v["llm_workers_server_state_file"],
                            self.sock], check=True, timeout=30)
        old = self.ask("show info")
        self.p.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while True:      # a new worker process: another Pid in show info
            time.sleep(0.2)
            try:
                info = self.ask("show info")
            except OSError:
                continue
            if pid(info) != pid(old):
                return
            assert time.monotonic() < deadline, "haproxy never reloaded"

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=30)

    def open(self, body: dict, timeout: float = 30) -> http.client.HTTPResponse:
        c = http.client.HTTPConnection("127.0.0.1", self.v["llm_workers_listen_port"], timeout=timeout)
        c.request("POST", "/v1/chat/completions", json.dumps(body),
                  {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        return c.getresponse()


def pid(info: str) -> str:
    return next(line for line in info.splitlines() if line.startswith("Pid:"))


def haproxy() -> str:
    tool = shutil.which("haproxy") or (Path("/usr/sbin/haproxy").exists() and "/usr/sbin/haproxy")
    assert tool, "haproxy (Debian's, scripts/host-packages.txt) is not installed"
    return tool


@pytest.fixture
def workers(tmp_path):
    """Start the stand-in workers once the configuration picked their port: start(port) -> {name: Popen}."""
    procs = {}

    def start(port: int) -> dict:
        for name, address in WORKERS.items():
            procs[name] = subprocess.Popen([sys.executable, str(STUB), address, str(port), name,
                                            str(tmp_path / "requests.log")])
        return procs

    yield start
    for p in procs.values():
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait(timeout=30)


@pytest.fixture
def front(tmp_path, workers):
    config, variables = render(tmp_path)
    procs = workers(variables["llm_workers_port"])
    f = Front(tmp_path, config, variables)
    f.workers = procs
    f.wait_until(lambda s: s == {"w0": "UP", "w1": "UP"}, "both workers up")
    yield f
    f.stop()


def test_the_shipped_configuration_cuts_a_downed_workers_sessions_and_waits_less_for_a_first_token(tmp_path):
    config, v = render(tmp_path)
    servers = [line.split() for line in config.splitlines() if line.strip().startswith("server ")]
    checked = [s for s in servers if "check" in s]
    assert checked and all("on-marked-down" in s and s[s.index("on-marked-down") + 1] == "shutdown-sessions"
                           for s in checked)
    assert v["llm_workers_first_byte_timeout_s"] < v["llm_workers_server_timeout_s"]
    assert f"timeout server {v['llm_workers_first_byte_timeout_s']}s" in config


def test_a_worker_that_hangs_mid_stream_releases_its_client_within_10_s(front):
    answer = front.open({"messages": [{"role": "user", "content": "hi"}], "stream": True})
    assert answer.status == 200
    worker = answer.getheader("X-LLM-Worker")
    assert answer.fp.readline().startswith(b"data: ")          # the stream has begun
    front.workers[worker].send_signal(signal.SIGSTOP)          # the node froze: no FIN, no RST, nothing
    stopped = time.monotonic()
    try:
        while answer.fp.readline():                            # the chunks already in flight, then the end
            pass
    except (ConnectionError, http.client.IncompleteRead):
        pass
    except TimeoutError:
        pytest.fail("the client was still held 30 s after its worker hung")
    released = time.monotonic() - stopped
    assert released < 10, f"the client was released {released:.1f} s after its worker hung"
    assert front.status()[worker] == "DOWN"


def test_a_request_a_hung_worker_had_not_answered_is_answered_by_the_other(front, tmp_path):
    log = tmp_path / "requests.log"
    result = {}

    def ask():
        answer = front.open({"messages": [{"role": "user", "content": "hi"}]}, timeout=60)
        body = answer.read()
        result.update(status=answer.status, worker=answer.getheader("X-LLM-Worker"),
                      body=json.loads(body) if answer.status == 200 else body.decode(errors="replace"))

    client = threading.Thread(target=ask)
    client.start()
    deadline = time.monotonic() + 30
    while not log.exists() or not log.read_text():
        assert time.monotonic() < deadline, "no worker got the request"
        time.sleep(0.05)
    first = log.read_text().split()[0]
    front.workers[first].send_signal(signal.SIGSTOP)           # it answers after 3 s: now never
    stopped = time.monotonic()
    client.join(timeout=60)
    answered = time.monotonic() - stopped
    other = next(w for w in WORKERS if w != first)
    assert result == {"status": 200, "worker": other, "body": {"worker": other}}, result
    assert answered < 15, f"answered {answered:.1f} s after the first worker hung"


def test_a_drain_survives_a_reload(front):
    assert front.ask("set server llm_workers/w1 state drain").strip() == ""
    front.reload()
    assert front.status()["w1"] == "DRAIN"          # at once: the new process read it at its start
    assert front.status("--admin") == {"w0": "ready", "w1": "drain"}


def test_without_the_saved_state_a_reload_returns_the_drained_worker(front, tmp_path):
    """The control for the test above: it is the saved file that keeps the drain."""
    assert front.ask("set server llm_workers/w1 state drain").strip() == ""
    assert not Path(front.v["llm_workers_server_state_file"]).exists()
    front.reload(save=False)
    front.wait_until(lambda s: s == {"w0": "UP", "w1": "UP"}, "w1 back after a reload without its state")
