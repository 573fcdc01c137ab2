"""A join with a fault, as tests/test_joins_retry.py passes it to the coordinator (Joins(argv=...)):

    join_faults.py fail-once MARK REQUEST RESULT   fails (exit 3, no result) if MARK does not exist, and
                                                   makes it; else joins as farm.join_runner does
    join_faults.py fail-while MARK REQUEST RESULT  fails (exit 3) while MARK exists; else joins
    join_faults.py hang MARK REQUEST RESULT        starts a child that sleeps with MARK in its argv (as
                                                   ffmpeg would run under the join), then hangs
"""

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from farm import join_runner

mode, mark, paths = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
if mode == "fail-once" and not mark.exists():
    mark.write_text(str(os.getpid()))
    sys.exit(3)
if mode == "fail-while" and mark.exists():
    sys.exit(3)
if mode == "hang":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", str(mark)])
    time.sleep(3600)
sys.exit(join_runner.main(paths))
