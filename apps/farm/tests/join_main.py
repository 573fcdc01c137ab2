"""A join as the tests run it (coordinator_main.py's FARM_TEST_SLOW_JOIN): one whose output path contains
that text waits for the file FARM_TEST_SLOW_JOIN_RELEASE (at most 300 s), then joins as farm.join_runner does."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from farm import join_runner

job = json.loads(Path(sys.argv[1]).read_text())["job"]
if os.environ["FARM_TEST_SLOW_JOIN"] in job["out"]:
    deadline = time.monotonic() + 300
    while not os.path.exists(os.environ["FARM_TEST_SLOW_JOIN_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.2)
sys.exit(join_runner.main(sys.argv[1:]))
