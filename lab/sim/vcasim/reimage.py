"""A lab node takes the way in of the disk it "booted": the simulated `vcactl boot` on the
lab host copies the disk's host key, root-login policy and each fleet user's authorized_keys
into the node's boot directory (vcactl.boot_from_disk), and this loop, on the node, installs
them and restarts sshd whenever a new vca-image.json lands there. A real reimage replaces
these files with the disk's; here the container keeps running, so they are copied in.

    python3 -m vcasim.reimage --booted /var/lib/vcasim/booted [--interval 0.5] [--once]
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"vcasim-reimage: {msg}", file=sys.stderr, flush=True)


def install(src: Path, dest: Path, mode: int, uid: int = 0, gid: int = 0) -> None:
    tmp = dest.with_name(f".{dest.name}.vcasim")
    tmp.unlink(missing_ok=True)
    # made with its mode: a private key is never readable by others, not even for a moment
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as out, open(src, "rb") as fh:
        shutil.copyfileobj(fh, out)
    os.chown(tmp, uid, gid)
    os.chmod(tmp, mode)
    os.replace(tmp, dest)


def user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:                   # the image has its admin user; the container gets it too
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--", name], check=True)
        return pwd.getpwnam(name)


def adopt(booted: Path, etc: Path = Path("/etc"), account=user) -> list[str]:
    """Install what booted/ holds of the disk's access; returns what was installed.
    account(name) -> passwd entry (created when missing); tests pass their own."""
    done = []
    for name, mode in (("ssh_host_ed25519_key", 0o600), ("ssh_host_ed25519_key.pub", 0o644)):
        if (booted / name).exists():
            install(booted / name, etc / "ssh" / name, mode)
            done.append(name)
    policy = etc / "ssh/sshd_config.d/00-root-login.conf"
    if (booted / "00-root-login.conf").exists():
        install(booted / "00-root-login.conf", policy, 0o644)
        done.append(policy.name)
    for keys in sorted(booted.glob("authorized_keys.*")):
        owner = account(keys.name.split(".", 1)[1])
        ssh_dir = Path(owner.pw_dir) / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(ssh_dir, owner.pw_uid, owner.pw_gid)
        os.chmod(ssh_dir, 0o700)
        install(keys, ssh_dir / "authorized_keys", 0o600, owner.pw_uid, owner.pw_gid)
        done.append(f"{owner.pw_name}'s authorized_keys")
    return done


def identity(path: Path):
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--booted", type=Path, default=Path("/var/lib/vcasim/booted"))
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--once", action="store_true", help="adopt what is there now and exit")
    args = ap.parse_args(argv)
    seen = None
    while True:
        now = identity(args.booted / "vca-image.json")
        if now is not None and now != seen:
            done = adopt(args.booted)
            if done:
                subprocess.run(["systemctl", "restart", "ssh.service"], check=False)
                log("adopted %s; sshd restarted" % ", ".join(done))
            seen = now
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
