# SPDX-License-Identifier: MIT
"""Controller side of vca_tree: packs the source directory into one reproducible
tar (links followed, sorted, times and owners zeroed) and asks the target for the
digest of what it holds; the tar travels only when the two differ."""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def pack(src, exclude):
    """(tar bytes, sha256) of every file under src whose relative path no exclude pattern matches."""
    patterns = [re.compile(p) for p in exclude]
    buf = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(src, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen:      # a link back up the tree: refused, not walked for ever
                raise AnsibleActionFail("vca_tree: %s links back into %s" % (dirpath, real))
            seen.add(real)
            rel_dir = os.path.relpath(dirpath, src)
            dirnames[:] = sorted(d for d in dirnames
                                 if not any(p.search(os.path.normpath(os.path.join(rel_dir, d))) for p in patterns))
            for name in sorted(filenames):
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if any(p.search(rel) for p in patterns):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, "rb") as fh:
                    data = fh.read()
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                info.mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
                tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src, dest = args.get("src"), args.get("dest")
        if not src or not dest:
            raise AnsibleActionFail("vca_tree needs src (a directory on the controller) and dest")
        src = self._find_needle("files", src)
        if not os.path.isdir(src):
            raise AnsibleActionFail("vca_tree: src %s is not a directory" % src)
        data, digest = pack(src, args.get("exclude") or [])
        module_args = {"dest": dest, "digest": digest}
        held = self._execute_module(module_name="vca_tree", module_args=module_args, task_vars=task_vars)
        if held.get("failed") or not held.get("changed") or self._task.check_mode:
            result.update(held)
            return result
        with tempfile.NamedTemporaryFile(suffix=".tar") as local:
            local.write(data)
            local.flush()
            remote = self._connection._shell.join_path(self._make_tmp_path(), "tree.tar")
            self._transfer_file(local.name, remote)
            self._fixup_perms2((self._connection._shell.tmpdir, remote))
            module_args["archive"] = remote
            result.update(self._execute_module(module_name="vca_tree", module_args=module_args, task_vars=task_vars))
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
