"""Running a render's tools (ffmpeg, node and the browser it starts) so that a cancel reaches them.

Celery's revoke(terminate=True) sends SIGTERM to the pool child, not to what the child runs: node
starts chromium and ffmpeg of its own, which a plain subprocess.run would leave rendering (and
writing parts) after the job is gone. So each command runs in its own session, and a SIGTERM to
the caller, or any exception out of the wait, takes the command's whole process group down first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

GRACE_S = 5.0   # SIGTERM, then this long, then SIGKILL


def run(argv: list, *, cwd=None, what: str = "command", error=RuntimeError) -> subprocess.CompletedProcess:
    """argv's stdout and stderr captured as text; `error` on a non-zero exit or a missing program."""
    argv = [str(a) for a in argv]
    child: list[subprocess.Popen] = []
    previous = _on_sigterm(child)
    try:
        try:
            p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        except FileNotFoundError as e:
            raise error(f"{what}: {e.filename or argv[0]} not found") from e
        with p:
            try:
                child.append(p)
                out, err = p.communicate()
            except BaseException:
                kill_group(p)
                raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if p.returncode != 0:
        tail = (err or out or "")[-4000:]
        raise error(f"{what} failed ({p.returncode}): {' '.join(argv)}\n{tail}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _on_sigterm(child: list):
    """Installs the handler (main thread only: Python's rule); the handler it replaced, else None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:          # a handler from C: it could not be put back
        return None

    def handler(signum, frame):
        signal.signal(signum, signal.SIG_IGN)        # a second SIGTERM does not cut the kill short
        if child:
            kill_group(child[0])
        signal.signal(signum, previous)
        if callable(previous):                       # billiard's pool child: SystemExit
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)
    signal.signal(signal.SIGTERM, handler)
    return previous


def kill_group(p: subprocess.Popen, grace: float | None = None) -> None:
    """SIGTERM to p's process group, SIGKILL to what is left of it after grace seconds. p is not
    reaped here (Popen's wait holds a lock the interrupted wait may hold): its `with` does that."""
    _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + (GRACE_S if grace is None else grace)
    while time.monotonic() < deadline and not _exited(p):
        time.sleep(0.05)
    _signal_group(p, signal.SIGKILL)   # the leader's children that outlived it, if any


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    if p.returncode is not None:   # reaped: its pid, the group's id, may be another's by now
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def _exited(p: subprocess.Popen) -> bool:
    """Exited (a zombie, not reaped: WNOWAIT) or reaped already."""
    if p.returncode is not None:
        return True
    try:
        return os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True
