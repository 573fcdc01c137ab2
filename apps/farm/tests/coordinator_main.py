"""A farm coordinator as the tests run it: `farm coordinator`, with faults a test asks for by environment.

FARM_TEST_PUBLISH_FAILS=N  the first N publishes of a chunk fail (as when the broker is away)
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from farm import cli, tasks

left = [int(os.environ.get("FARM_TEST_PUBLISH_FAILS", "0"))]
real_send_task = tasks.app.send_task


def send_task(name, *args, **kwargs):
    if name == "farm.render" and left[0] > 0:
        left[0] -= 1
        raise ConnectionError("injected: the chunk's publish failed")
    return real_send_task(name, *args, **kwargs)


tasks.app.send_task = send_task
sys.exit(cli.main(["coordinator", *sys.argv[1:]]))
