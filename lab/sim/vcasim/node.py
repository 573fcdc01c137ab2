"""vcasim-node: keeps one lab node's simulated sysfs tree alive (systemd service)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from .load import LoadMeter, load_input
from .model import NodeModel, load_params
from .tree import SysfsTree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vcasim-node", description=__doc__)
    ap.add_argument("--root", required=True, help="sysfs root to keep alive (vca_sysfs_root)")
    ap.add_argument("--airflow", required=True, help="airflow profile from params.yml")
    ap.add_argument("--params", default=None, help="params.yml (default: the one beside the package)")
    ap.add_argument("--tick", type=float, default=1.0, help="seconds between updates")
    ap.add_argument("--load-input", type=Path, default=None,
                    help="file a test may write a load (0..1) into; absent: the container's CPU use")
    args = ap.parse_args(argv)

    params = load_params(args.params) if args.params else load_params()
    model = NodeModel.from_params(params, args.airflow)
    tree = SysfsTree(args.root, params["node"])
    tree.create()
    tree.restore(model)
    meter = LoadMeter()

    running = True

    def stop(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    limits = tree.read_limits()
    last = time.monotonic()
    while running:
        time.sleep(args.tick)
        now = time.monotonic()
        try:
            limits = tree.read_limits()
        except (OSError, ValueError, KeyError) as exc:
            # A half-written or bad limit file keeps the last good limits, as the kernel would.
            print(f"vcasim-node: keeping previous limits: {exc}", file=sys.stderr)
        load = meter.sample()
        try:
            forced = load_input(args.load_input)
        except ValueError as exc:
            forced = None
            print(f"vcasim-node: ignoring the load input: {exc}", file=sys.stderr)
        model.step(now - last, load if forced is None else forced, limits)
        last = now
        tree.publish(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
