"""A farm worker as the tests run it: `farm worker`, with faults a test asks for by environment.

FARM_TEST_MIN_CHUNK_S  a chunk takes at least this long (the real render, then a wait), so a test can
                       act while a chunk is in progress on a busy machine
FARM_TEST_S_PER_FRAME  a chunk takes at least its frames times this long (the benches' render speed)
FARM_TEST_POISON       a chunk index whose render kills its pool process (SIGKILL), on every node
FARM_TEST_BROKEN=1     every render fails (as a node without a working renderer does)
FARM_TEST_SILENT=PATH  the first chunk this node starts while PATH does not exist (PATH is made then)
                       renders, but every report of it after `started` fails to publish
FARM_TEST_HANG=N       the render of chunk N hangs (it writes nothing, its reports go on), on every node
                       while the file FARM_TEST_HANG_MARK does not exist (the first hang makes it)
FARM_TEST_RECORD=PATH  each render appends {"index", "spec"} (the spec render_chunk got) to PATH, a line
FARM_TEST_BROKEN_ONCE=PATH  a render fails while PATH does not exist (the failure makes it)
FARM_TEST_PUT_BACK_FAILS=1  the broker refuses this node's copy of a chunk it puts back (tasks._put_back)
FARM_TEST_PUT_BACK_RECORD=PATH  each copy this node puts back appends its send_task options to PATH, a line
FARM_TEST_STARTED_FAILS=PATH  the first `started` report fails to publish while PATH does not exist (it is made then)
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from kombu.exceptions import OperationalError

from farm import cli, render, tasks

real_render, real_report, real_send_task = render.render_chunk, tasks.report, tasks.app.send_task
silenced = set()


def render_chunk(spec, index, first, last, workdir, **kw):
    t0 = time.monotonic()
    if os.environ.get("FARM_TEST_RECORD"):
        with open(os.environ["FARM_TEST_RECORD"], "a") as f:
            f.write(json.dumps({"index": index, "spec": spec}) + "\n")
    if os.environ.get("FARM_TEST_POISON") == str(index):
        os.kill(os.getpid(), signal.SIGKILL)
    mark = os.environ.get("FARM_TEST_HANG_MARK")
    if os.environ.get("FARM_TEST_HANG") == str(index) and mark and not os.path.exists(mark):
        Path(mark).write_text(str(index))
        time.sleep(3600)
    if os.environ.get("FARM_TEST_BROKEN"):
        raise render.RenderError("injected: this node's renderer is broken")
    once = os.environ.get("FARM_TEST_BROKEN_ONCE")
    if once and not os.path.exists(once):
        Path(once).touch()
        raise render.RenderError("injected: this node's renderer failed once")
    out = real_render(spec, index, first, last, workdir, **kw)
    least = max(float(os.environ.get("FARM_TEST_MIN_CHUNK_S", "0")),
                float(os.environ.get("FARM_TEST_S_PER_FRAME", "0")) * (last - first + 1))
    time.sleep(max(0.0, least - (time.monotonic() - t0)))
    return out


def report(event, **fields):
    once = os.environ.get("FARM_TEST_STARTED_FAILS")
    if once and event == "started" and not os.path.exists(once):
        Path(once).touch()
        raise ConnectionError("injected: `started` cannot be published")
    marker = os.environ.get("FARM_TEST_SILENT")
    if marker and event == "started" and not os.path.exists(marker):
        Path(marker).touch()
        silenced.add(fields["attempt"])
    elif fields.get("attempt") in silenced:
        raise ConnectionError("injected: the report of %s cannot be published" % event)
    return real_report(event, **fields)


def send_task(name, *args, **kwargs):
    if name == "farm.render":                   # in a worker, only tasks._put_back sends one
        if os.environ.get("FARM_TEST_PUT_BACK_RECORD"):
            with open(os.environ["FARM_TEST_PUT_BACK_RECORD"], "a") as f:
                f.write(json.dumps({k: v for k, v in kwargs.items() if k != "kwargs"}) + "\n")
        if os.environ.get("FARM_TEST_PUT_BACK_FAILS"):
            raise OperationalError("injected: the broker refused the copy")
    return real_send_task(name, *args, **kwargs)


render.render_chunk = render_chunk
tasks.report = report
tasks.app.send_task = send_task
sys.exit(cli.main(["worker", *sys.argv[1:]]))
