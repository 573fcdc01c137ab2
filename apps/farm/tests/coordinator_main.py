"""A farm coordinator as the tests run it: `farm coordinator`, with faults a test asks for by environment.

FARM_TEST_PUBLISH_FAILS=N  the first N publishes of a chunk fail (as when the broker is away)
FARM_TEST_CRASH_AT=POINT   SIGKILL of the coordinator at that named step of a job's life (Coordinator(fault=...)),
                           the first time it is reached while the file FARM_TEST_CRASH_MARK does not exist
                           (it is made then, so the restarted coordinator goes past)
FARM_TEST_CANCEL_FAILS=N   the first N cancel_consumer calls fail (as when the broker is away)
FARM_TEST_APPLY_FAILS=N    applying the first N `done` reports fails (as SQLite busy or a full disk would)
FARM_TEST_SLOW_JOIN=TEXT   the join of a job whose output path contains TEXT waits (tests/join_main.py) until
                           the file FARM_TEST_SLOW_JOIN_RELEASE exists
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from farm import cli, tasks
from farm.broker_control import BrokerControl
from farm.coordinator import Coordinator
from farm.join_runner import Joins
from farm.statemachine import StateMachine

left = [int(os.environ.get("FARM_TEST_PUBLISH_FAILS", "0"))]
real_send_task = tasks.app.send_task


def send_task(name, *args, **kwargs):
    if name == "farm.render" and left[0] > 0:
        left[0] -= 1
        raise ConnectionError("injected: the chunk's publish failed")
    return real_send_task(name, *args, **kwargs)


cancels_left = [int(os.environ.get("FARM_TEST_CANCEL_FAILS", "0"))]
real_cancel = BrokerControl.cancel_consumers


def cancel_consumers(self, jid, nodes):
    if cancels_left[0] > 0:
        cancels_left[0] -= 1
        raise ConnectionError("injected: cancel_consumer failed")
    return real_cancel(self, jid, nodes)


applies_left = [int(os.environ.get("FARM_TEST_APPLY_FAILS", "0"))]
real_apply = StateMachine.apply


def apply(self, r):
    if r.get("event") == "done" and applies_left[0] > 0:
        applies_left[0] -= 1
        raise OSError(28, "injected: No space left on device")
    return real_apply(self, r)


def fault(point):
    mark = os.environ.get("FARM_TEST_CRASH_MARK")
    if point == os.environ.get("FARM_TEST_CRASH_AT") and mark and not os.path.exists(mark):
        Path(mark).write_text(point)
        os.kill(os.getpid(), signal.SIGKILL)


tasks.app.send_task = send_task
BrokerControl.cancel_consumers = cancel_consumers
StateMachine.apply = apply
real_init = Coordinator.__init__


def init(self, settings, **kw):
    if os.environ.get("FARM_TEST_SLOW_JOIN"):     # the coordinator's joins run through tests/join_main.py
        kw["joins"] = Joins(settings, argv=[sys.executable, str(Path(__file__).resolve().parent / "join_main.py")])
    real_init(self, settings, fault=fault, **kw)


Coordinator.__init__ = init
sys.exit(cli.main(["coordinator", *sys.argv[1:]]))
