#!/usr/bin/env python3
"""Write a per-node overlay into a node disk, as the node_image role does (library/vca_node_disk.py),
with the same writer: module_utils/vca_node_image.py's write_files, loaded as a plain module (it
needs the standard library only, so no Ansible here).

    scripts/node-disk-overlay.py DISK SPEC.json

SPEC.json is the module's `files`: absolute path -> text, or {content | src, mode, owner, group,
state}. DISK is written in place: give it a copy (scripts/image-test.sh does).
"""

import importlib.util
import json
import sys
from pathlib import Path

WRITER = Path(__file__).resolve().parent.parent / "module_utils" / "vca_node_image.py"


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("vca_node_image", WRITER)
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    disk, files = argv[0], json.loads(Path(argv[1]).read_text())
    try:
        writer.write_files(disk, files)
    except writer.NodeImageError as exc:
        print("node-disk-overlay: %s" % exc, file=sys.stderr)
        return 1
    print("node-disk-overlay: %d entries written into %s (overlay %s)" % (len(files), disk,
                                                                           writer.overlay_digest(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
