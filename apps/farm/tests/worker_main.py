"""A farm worker as the tests run it: `farm worker`, with faults a test asks for by environment.

FARM_TEST_MIN_CHUNK_S  a chunk takes at least this long (the real render, then a wait), so a test can
                       act while a chunk is in progress on a busy machine
FARM_TEST_POISON       a chunk index whose render kills its pool process (SIGKILL), on every node
FARM_TEST_BROKEN=1     every render fails (as a node without a working renderer does)
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from farm import cli, render

real = render.render_chunk


def render_chunk(spec, index, first, last, workdir):
    t0 = time.monotonic()
    if os.environ.get("FARM_TEST_POISON") == str(index):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("FARM_TEST_BROKEN"):
        raise render.RenderError("injected: this node's renderer is broken")
    out = real(spec, index, first, last, workdir)
    time.sleep(max(0.0, float(os.environ.get("FARM_TEST_MIN_CHUNK_S", "0")) - (time.monotonic() - t0)))
    return out


render.render_chunk = render_chunk
sys.exit(cli.main(["worker", *sys.argv[1:]]))
