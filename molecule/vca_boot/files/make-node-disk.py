#!/usr/bin/env python3
"""make-node-disk.py PATH BUILD_ID: the least disk that lab/sim's vcactl boots, for molecule/vca_boot.

A GPT header whose partition 2 starts at LBA 2048, and there an ext4 holding
/etc/vca-image.json: what vcasim.vcactl.boot_from_disk reads (root_partition_offset
reads no checksum). No bootloader, no OS: not a node image (node_image builds those).
Only e2fsprogs is needed (mke2fs -E offset=), which the lab image has.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile

SECTOR = 512
START = 2048          # partition 2's first LBA
FS_MIB = 8

path, build_id = sys.argv[1], sys.argv[2]
fs_sectors = FS_MIB * 2**20 // SECTOR
tmp = path + ".new"
with tempfile.TemporaryDirectory() as root:
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc", "vca-image.json"), "w") as fh:
        json.dump({"build_id": build_id, "profile": "molecule-vca_boot"}, fh)
    with open(tmp, "wb") as fh:
        fh.truncate((START + fs_sectors + 2048) * SECTOR)
        header = bytearray(92)
        header[:8] = b"EFI PART"
        struct.pack_into("<QII", header, 72, 2, 128, 128)       # entries at LBA 2: 128 of 128 bytes
        fh.seek(SECTOR)
        fh.write(header)
        entry = bytearray(128)
        struct.pack_into("<QQ", entry, 32, START, START + fs_sectors - 1)
        fh.seek(2 * SECTOR + 128)                                # entry 2
        fh.write(entry)
    subprocess.run(["mke2fs", "-q", "-F", "-t", "ext4", "-E", "offset=%d" % (START * SECTOR), "-d", root,
                    tmp, "%dM" % FS_MIB], check=True, env=dict(os.environ, LC_ALL="C"))
os.replace(tmp, path)
