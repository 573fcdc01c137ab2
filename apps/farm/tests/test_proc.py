"""farm.proc.run: errors as the callers raise them, and a SIGTERM (Celery's revoke with terminate) or
an exception in the caller takes the command's whole process group down, grandchildren included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(APP / "src"))

from farm import proc  # noqa: E402


class Boom(RuntimeError):
    pass


def alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_output_errors_and_a_missing_program():
    done = proc.run(["sh", "-c", "echo out; echo err >&2", 1], what="x")
    assert done.returncode == 0 and done.stdout == "out\n" and done.stderr == "err\n"
    assert done.args == ["sh", "-c", "echo out; echo err >&2", "1"]
    with pytest.raises(Boom, match=r"(?s)the step failed \(3\): sh -c .*\nbad news") as e:
        proc.run(["sh", "-c", "echo bad news >&2; exit 3"], what="the step", error=Boom)
    assert str(e.value).endswith("bad news\n")
    with pytest.raises(Boom, match="the step: /nonexistent/tool not found"):
        proc.run(["/nonexistent/tool"], what="the step", error=Boom)
    assert proc.run(["pwd"], cwd="/").stdout == "/\n"


def test_the_sigterm_handler_is_put_back_and_only_the_main_thread_installs_one():
    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def probe():
        seen["thread"] = proc.run(["sh", "-c", "sleep 0.3"]).returncode
    t = threading.Thread(target=probe)
    t.start()
    time.sleep(0.1)
    seen["during"] = signal.getsignal(signal.SIGTERM)      # the thread's run did not touch it
    t.join()
    assert seen == {"thread": 0, "during": before}
    with pytest.raises(RuntimeError):
        proc.run(["sh", "-c", "exit 1"])
    assert signal.getsignal(signal.SIGTERM) is before


# A caller as the pool child is: the command it runs starts a grandchild (node starts chromium and
# ffmpeg) and writes its pid; the test then sends SIGTERM to the caller, or the caller interrupts itself.
CALLER = r"""
import faulthandler, signal, sys
faulthandler.dump_traceback_later(25)   # a caller hung in run() says where, before the test's 30 s
sys.path.insert(0, %(src)r)
from farm import proc
proc.GRACE_S = %(grace)r
signal.signal(signal.SIGINT, signal.default_int_handler)   # a caller started from `cmd &` inherits SIGINT ignored
mode = sys.argv[1]
if mode == "handler":
    def stop(signum, frame):
        sys.exit(7)
    signal.signal(signal.SIGTERM, stop)
script = %(script)r
try:
    proc.run(["sh", "-c", script, "sh", %(pidfile)r])
except KeyboardInterrupt:
    sys.exit(9)
print("returned")
"""


def caller(tmp_path, mode: str, *, ignore_term: bool = False, grace: float = 5.0):
    pidfile = tmp_path / "grandchild.pid"
    # `sleep &` in a non-interactive sh ignores SIGINT, and with ignore_term SIGTERM as well (ignored
    # signals are inherited): only the group's SIGKILL ends it then.
    script = ("trap '' TERM; " if ignore_term else "") + 'sleep 300 & echo $! > "$1"; wait'
    code = CALLER % {"src": str(APP / "src"), "grace": grace, "script": script, "pidfile": str(pidfile)}
    p = subprocess.Popen([sys.executable, "-c", code, mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 20), p.communicate(timeout=5)
    return p, int(pidfile.read_text())


@pytest.mark.parametrize("mode, rc", [("default", -signal.SIGTERM), ("handler", 7)])
def test_sigterm_to_the_caller_kills_the_commands_whole_group_then_does_what_it_did_before(tmp_path, mode, rc):
    p, grandchild = caller(tmp_path, mode)
    assert alive(grandchild)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == rc, (out, err)        # SIG_DFL: it dies of SIGTERM; a handler of its own ran
    assert "returned" not in out
    assert wait_until(lambda: not alive(grandchild), 3), "the grandchild outlived the caller"
    assert time.monotonic() - t0 < 4             # SIGTERM was enough: no grace waited out


def test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace(tmp_path):
    p, grandchild = caller(tmp_path, "default", ignore_term=True, grace=1.0)
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == -signal.SIGTERM
    assert wait_until(lambda: not alive(grandchild), 3)
    assert 0.9 < took < 5, took


def test_an_exception_in_the_wait_kills_the_group_before_it_propagates(tmp_path):
    p, grandchild = caller(tmp_path, "interrupt")
    p.send_signal(signal.SIGINT)                 # Ctrl-C: KeyboardInterrupt in the wait
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail("the caller hung in run() after SIGINT:\n" + p.communicate()[1][-4000:])
    assert p.returncode == 9, (out, err)         # it came out of run()
    assert not alive(grandchild)                 # gone before run() let the exception through


def test_the_command_runs_in_a_session_of_its_own():
    done = proc.run(["sh", "-c", "ps -o sid= -p $$"])
    assert int(done.stdout) != os.getsid(0)
