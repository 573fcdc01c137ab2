"""vcactl stand-in for the lab host: the real command's status strings and verbs.

State lives in a JSON file; timed transitions (booting -> os_ready ->
net_device_ready, resetting -> bios_up, powering_down -> power_off) are
resolved lazily from timestamps, so no daemon is needed. Nodes configured as
dead answer link_down to everything, as node 3 does on the seed host.

    vcactl status [card [cpu]]
    vcactl boot [card [cpu]] [image|vcablk0]   (vcablk0: only once blockio opened it)
    vcactl blockio open card cpu vcablk0 RW|RO PATH | blockio close card cpu vcablk0 | blockio list
    vcactl reset | pwrbtn-short | pwrbtn-long | os-shutdown [card [cpu]]
    vcactl wait | wait-BIOS [card [cpu]] [--timeout S]
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .model import load_params
from .vca_node_image import NodeImageError, root_partition_offset  # the host-side code's own reader

CONFIG = Path(os.environ.get("VCASIM_VCACTL_CONFIG", "/etc/vcasim/vcactl.yml"))
STATE = Path(os.environ.get("VCASIM_VCACTL_STATE", "/var/lib/vcasim/vcactl.json"))
BOOT_DIR = Path(os.environ.get("VCASIM_BOOT_DIR", "/var/lib/vcasim/boot"))
# What a booted node's files say about it, as the lab node sees them. vca-image.json goes
# last: the node's vcasim-reimage takes a new one as the sign that the rest is there.
BOOTED_FILES = ("/etc/vca-node.conf", "/etc/vca-node.local.conf", "/etc/hostname",
                "/usr/local/sbin/vca-node-verify")
# The way in that the disk's overlay gave the node: its host key and root-login policy, and
# each fleet user's authorized_keys (FLEET_USERS in vca-node.local.conf) as authorized_keys.<user>.
ACCESS_FILES = {"/etc/ssh/ssh_host_ed25519_key": 0o600, "/etc/ssh/ssh_host_ed25519_key.pub": 0o644,
                "/etc/ssh/sshd_config.d/00-root-login.conf": 0o644}

OS_UP = ("os_ready", "net_device_ready")
BOOTABLE = ("bios_up", "bios_ready")


class VcactlError(Exception):
    pass


class Fleet:
    def __init__(self, config: dict, state: dict, timing: dict, clock=time.time):
        self.timing = timing
        self.clock = clock
        self.nodes = {}
        for entry in config["nodes"]:
            key = f"{entry['card']}:{entry['cpu']}"
            saved = state.get(key, {})
            self.nodes[key] = {
                "card": entry["card"],
                "cpu": entry["cpu"],
                "dead": bool(entry.get("dead", False)),
                "state": saved.get("state", entry.get("initial", "bios_up")),
                "since": saved.get("since", self.clock()),
                "blockio": saved.get("blockio"),
                "boot_ok": saved.get("boot_ok", True),
            }
        self.boot_dir = BOOT_DIR

    def dump(self) -> dict:
        return {k: {"state": n["state"], "since": n["since"], "blockio": n["blockio"], "boot_ok": n["boot_ok"]}
                for k, n in self.nodes.items()}

    def _advance(self, node: dict) -> None:
        chain = {
            "booting": ("os_ready" if node["boot_ok"] else "error", self.timing["boot_s"]),
            "os_ready": ("net_device_ready", self.timing["net_s"]),
            "resetting": ("bios_up", self.timing["reset_s"]),
            "powering_down": ("power_off", self.timing["shutdown_s"]),
        }
        while node["state"] in chain:
            nxt, delay = chain[node["state"]]
            if self.clock() < node["since"] + delay:
                return
            node["state"], node["since"] = nxt, node["since"] + delay

    def state(self, node: dict) -> str:
        if node["dead"]:
            return "link_down"
        self._advance(node)
        return node["state"]

    def select(self, args: list[str]) -> list[dict]:
        if not args:
            return [self.nodes[k] for k in sorted(self.nodes)]
        card = args[0]
        chosen = [n for n in self.nodes.values() if str(n["card"]) == card]
        if len(args) > 1:
            chosen = [n for n in chosen if str(n["cpu"]) == args[1]]
        if not chosen:
            raise VcactlError(f"ERROR: Card: {args[0]} Cpu: {args[1] if len(args) > 1 else '-'} - no such node")
        return sorted(chosen, key=lambda n: (n["card"], n["cpu"]))

    def _set(self, node: dict, state: str) -> None:
        node["state"], node["since"] = state, self.clock()

    def boot(self, node: dict, image: str | None = None) -> None:
        current = self.state(node)
        if current not in BOOTABLE and current not in OS_UP:
            raise VcactlError(
                f'ERROR: Card: {node["card"]} Cpu: {node["cpu"]} - Card needs to be in "bios_up" '
                f'or "bios_ready" state!'
            )
        if current in BOOTABLE:
            if image == "vcablk0":
                if not node["blockio"]:   # as the real one: nothing to boot from; the node stays where it is
                    raise VcactlError(
                        f"ERROR: Card: {node['card']} Cpu: {node['cpu']} - vcablk0 is not opened "
                        f"(vcactl blockio open {node['card']} {node['cpu']} vcablk0 RW|RO <path>)"
                    )
                node["boot_ok"] = boot_from_disk(node["blockio"], self.boot_dir / f"{node['card']}-{node['cpu']}")
            else:   # an image path (volatile boot), or the configured os-image: not inspected
                node["boot_ok"] = True
            self._set(node, "booting")

    def blockio(self, node: dict, args: list[str]) -> None:
        """blockio open|close for one node's vcablk0, as the real command takes them."""
        verb = args[0]
        if verb == "open":
            if len(args) < 4 or args[1] != "vcablk0" or args[2] not in ("RW", "RO"):
                raise VcactlError("usage: vcactl blockio open <card> <cpu> vcablk0 RW|RO <path>")
            if self.state(node) not in (*BOOTABLE, "power_off"):
                raise VcactlError(f"ERROR: Card: {node['card']} Cpu: {node['cpu']} - cannot open blockio "
                                  f"while the node is {self.state(node)}")
            if not os.path.isfile(args[3]):
                raise VcactlError(f"ERROR: {args[3]}: no such file")
            node["blockio"] = os.path.abspath(args[3])
        elif verb == "close":
            if self.state(node) in (*OS_UP, "booting"):
                raise VcactlError(f"ERROR: Card: {node['card']} Cpu: {node['cpu']} - vcablk0 in use by the OS")
            node["blockio"] = None
        else:
            raise VcactlError(f"ERROR: unknown blockio command {verb}")

    def reset(self, node: dict) -> None:
        self._require_link(node)
        self._set(node, "resetting")

    def os_shutdown(self, node: dict) -> None:
        if self.state(node) not in OS_UP:
            raise VcactlError(
                f'ERROR: Card: {node["card"]} Cpu: {node["cpu"]} - Card needs to be in "os_ready" '
                f'or "net_device_ready" state!'
            )
        self._set(node, "powering_down")

    def pwrbtn_short(self, node: dict) -> None:
        current = self.state(node)
        self._require_link(node)
        if current == "power_off":
            self._set(node, "bios_up")
        elif current in OS_UP or current == "booting":
            self._set(node, "powering_down")

    def pwrbtn_long(self, node: dict) -> None:
        self._require_link(node)
        self._set(node, "power_off")

    def _require_link(self, node: dict) -> None:
        if self.state(node) == "link_down":
            raise VcactlError(f"ERROR: Card: {node['card']} Cpu: {node['cpu']} - link down")


def _dump(target: str, path: str, dest: Path, mode: int) -> bool:
    """debugfs's copy of path in the disk's root file system as dest (mode), replacing it; False when absent."""
    with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
        pass
    done = subprocess.run(["debugfs", "-R", f"dump {path} {tmp.name}", target],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or os.path.getsize(tmp.name) == 0:
        os.unlink(tmp.name)
        return False
    os.chmod(tmp.name, mode)
    os.replace(tmp.name, dest)
    return True


def fleet_users(local_conf: Path) -> list[str]:
    """FLEET_USERS from the overlay's vca-node.local.conf: the users the disk admits over SSH."""
    if not local_conf.exists():
        return []
    for line in local_conf.read_text().splitlines():
        if line.startswith("FLEET_USERS="):
            return [u for u in line.split("=", 1)[1].split() if u.replace("-", "").replace("_", "").isalnum()]
    return []


def boot_from_disk(disk: str, out: Path) -> bool:
    """Read what a booting node would from its disk; False when it is not a bootable VCA image."""
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(out):          # nothing of the image booted before may linger
        os.unlink(out / name)
    try:
        target = f"{disk}?offset={root_partition_offset(disk)}"
    except (OSError, NodeImageError):
        return False
    for path in BOOTED_FILES:
        _dump(target, path, out / os.path.basename(path), 0o755 if "/sbin/" in path else 0o644)
    for path, mode in ACCESS_FILES.items():
        _dump(target, path, out / os.path.basename(path), mode)
    for user in fleet_users(out / "vca-node.local.conf"):
        home = "/root" if user == "root" else f"/home/{user}"
        _dump(target, f"{home}/.ssh/authorized_keys", out / f"authorized_keys.{user}", 0o600)
    return _dump(target, "/etc/vca-image.json", out / "vca-image.json", 0o644)


def line(node: dict, state: str) -> str:
    return f"Card: {node['card']} Cpu: {node['cpu']}  STATE: {state}"


def _wait(fleet: Fleet, nodes: list[dict], goal: str, timeout: float, *, out, sleep) -> int:
    rc = 0
    deadline = fleet.clock() + timeout
    for n in nodes:
        while (state := fleet.state(n)) != goal:
            if state == "link_down" or fleet.clock() >= deadline:
                print(f"ERROR: Card: {n['card']} Cpu: {n['cpu']} - state {state}, not {goal}", file=out)
                rc = 1
                break
            sleep(0.2)
    return rc


def _blockio(fleet: Fleet, rest: list[str], out) -> int:
    if not rest or rest[0] == "list":
        for n in fleet.select([]):
            print(f"Card: {n['card']} Cpu: {n['cpu']}  vcablk0: {n['blockio'] or 'closed'}", file=out)
        return 0
    numbers = [a for a in rest[1:3] if a.isdigit()]
    if len(numbers) != 2:
        print("usage: vcactl blockio open|close <card> <cpu> vcablk0 ...", file=out)
        return 2
    try:
        node = fleet.select(numbers)[0]
        fleet._require_link(node)
        fleet.blockio(node, [rest[0], *rest[3:]])
    except VcactlError as exc:
        print(exc, file=out)
        return 1
    return 0


def run(argv: list[str], fleet: Fleet, out=sys.stdout, sleep=time.sleep) -> int:
    if not argv:
        print(__doc__.strip(), file=out)
        return 1
    if argv[0] == "blockio":
        return _blockio(fleet, argv[1:], out)
    return _node_verb(argv[0], argv[1:], fleet, out, sleep)


def _node_verb(verb: str, rest: list[str], fleet: Fleet, out, sleep) -> int:
    timeout = 300.0
    if "--timeout" in rest:
        i = rest.index("--timeout")
        timeout = float(rest[i + 1])
        rest = rest[:i] + rest[i + 2:]
    actions = {
        "boot": fleet.boot,
        "reset": fleet.reset,
        "os-shutdown": fleet.os_shutdown,
        "pwrbtn-short": fleet.pwrbtn_short,
        "pwrbtn-long": fleet.pwrbtn_long,
    }
    waits = {"wait": "net_device_ready", "wait-BIOS": "bios_up"}
    if verb != "status" and verb not in actions and verb not in waits:
        print(f"ERROR: unknown command {verb}", file=out)
        return 2
    try:
        nodes = fleet.select([a for a in rest if a.isdigit()][:2])
    except VcactlError as exc:
        print(exc, file=out)
        return 1
    if verb == "status":
        for n in nodes:
            print(line(n, fleet.state(n)), file=out)
        return 0
    if verb in waits:
        return _wait(fleet, nodes, waits[verb], timeout, out=out, sleep=sleep)
    image = next((a for a in rest if not a.isdigit()), None)
    rc = 0
    for n in nodes:
        try:
            if verb == "boot":
                fleet.boot(n, image)
            else:
                actions[verb](n)
        except VcactlError as exc:
            print(exc, file=out)
            rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    config = yaml.safe_load(CONFIG.read_text())
    timing = load_params(config["params"])["vcactl"] if "params" in config else load_params()["vcactl"]
    STATE.parent.mkdir(parents=True, exist_ok=True)
    with open(STATE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        saved = json.loads(STATE.read_text()) if STATE.exists() else {}
        fleet = Fleet(config, saved, timing)
        if argv and argv[0].startswith("wait"):
            # Transitions are pure functions of time: waiting needs no lock and saves nothing.
            fcntl.flock(lock, fcntl.LOCK_UN)
            return run(argv, fleet)
        rc = run(argv, fleet)
        tmp = STATE.with_suffix(".tmp")
        tmp.write_text(json.dumps(fleet.dump(), indent=1, sort_keys=True))
        os.replace(tmp, STATE)
    return rc


if __name__ == "__main__":
    sys.exit(main())
