"""Profiles: YAML files that extend one another, validated before anything is downloaded.

A profile names what it `extends` by name: a profile in its own directory
first, then one in the shipped profiles (profiles_dir(), or the directory given
to load()), so a profile of one's own, anywhere, can extend a shipped one.
Mappings merge key by key; `packages` and `overlays` from the child are added to
the parent's; any other value replaces the parent's. An overlay is relative to
the directory above the profile file that names it (image_builder/ for the
shipped ones). The merged result is checked against SCHEMA; every error names
the file and the key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jsonschema
import yaml

ADDITIVE = ("packages", "overlays")
# A user or group name as useradd takes it, and nothing a shell could read as more:
# lower case, digits, _ and -, not starting with - or a digit, at most 32 characters.
# \Z, not $: Python's $ also matches before a trailing newline.
ACCOUNT_NAME = {"type": "string", "pattern": r"^[a-z_][a-z0-9_-]{0,31}\Z",
                "description": "a user or group name: [a-z_][a-z0-9_-]*, at most 32 characters"}
DEB_NAME = {"type": "string", "pattern": r"^[a-z0-9][a-z0-9+.-]*\Z", "description": "a Debian package name"}
# A systemd service name: it goes into vca-node.conf (KEY=value, space-separated) for the verifier.
SERVICE_NAME = {"type": "string", "pattern": r"^[A-Za-z0-9:_.@-]+\.service\Z",
                "description": "a systemd service name (NAME.service)"}
# boot.cmdline: kernel arguments separated by single spaces, each of characters GRUB's script reads as
# plain text, and the builder's placeholders {root_partuuid} and {fs_uuid}.
_ARG = r"(?:[A-Za-z0-9_.,:=/@+%-]|\{root_partuuid\}|\{fs_uuid\})+"
CMDLINE = {"type": "string", "pattern": r"^%s(?: %s)*\Z" % (_ARG, _ARG),
           "description": "a kernel command line: arguments of [A-Za-z0-9_.,:=/@+%-] and the placeholders "
                          "{root_partuuid} and {fs_uuid}, separated by single spaces"}
# kernel.vca_userspace.version in a shipped profile when this project does not know the version of
# Intel's packages: kernel_debs() refuses it, naming the version it found, before anything is downloaded.
UNSET = "UNSET"

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "suite", "mirror", "packages", "kernel", "network", "formats"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9.-]*$"},
        "extends": {"type": "string"},
        "description": {"type": "string"},
        "abstract": {"type": "boolean"},
        "suite": {"type": "string"},
        "mirror": {"type": "string", "pattern": "^(https?|file)://"},
        "components": {"type": "array", "items": {"type": "string"}},
        "variant": {"enum": ["minbase", "essential", "apt", "important", "required", "standard"]},
        "packages": {"type": "array", "items": {"type": "string", "pattern": "^[a-z0-9][a-z0-9+.-]*$"},
                     "minItems": 1},
        "kernel": {
            "type": "object",
            "additionalProperties": False,
            "required": ["source"],
            "properties": {
                # distribution: the suite's own kernel packages (CI's QEMU boot);
                # debs_dir: Intel's VCA kernel packages from a directory the user provides.
                "source": {"enum": ["distribution", "debs_dir"]},
                "packages": {"type": "array", "items": {"type": "string"}},
                "debs_dir": {"type": "string"},
                "version": {"type": "string"},
                "names": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                # Intel's node-side VCA userspace from the same debs_dir: the VCA modules and the node
                # agent that reports os_ready/net_device_ready and carries out os-shutdown. Checked by
                # name and version like the kernel; agent_units go to the verifier (VCA_AGENT_UNITS).
                "vca_userspace": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["names", "version", "agent_units"],
                    "properties": {
                        "names": {"type": "array", "items": DEB_NAME, "minItems": 1},
                        "version": {"type": "string"},
                        "agent_units": {"type": "array", "items": SERVICE_NAME, "minItems": 1},
                    },
                },
            },
        },
        "users": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": ACCOUNT_NAME,
                    "groups": {"type": "array", "items": ACCOUNT_NAME},
                    "authorized_keys": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
        "network": {
            "type": "object",
            "additionalProperties": False,
            "required": ["interface", "mtu"],
            "properties": {
                "interface": {"type": "string"},
                "mtu": {"type": "integer", "minimum": 576, "maximum": 65535},
                "ifnames": {"type": "boolean"},
                "dhcp": {"type": "boolean"},
            },
        },
        "overlays": {"type": "array", "items": {"type": "string"}},
        # what the on-node verifier holds this image's nodes to
        "verify": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"mem_floor_mib": {"type": "integer", "minimum": 0}},
        },
        # how the blockio disk boots: its ESP's grub.cfg loads /boot/vmlinuz with this command line
        # (default build.DEFAULT_CMDLINE: root=PARTUUID={root_partuuid} rw console=ttyS0 net.ifnames=0)
        "boot": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"cmdline": CMDLINE},
        },
        # blockio (the persistent disk) is always built; volatile (RAM boot) where asked for
        "formats": {"type": "array", "items": {"enum": ["blockio", "volatile"]}, "contains": {"const": "blockio"}},
        "image": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "size_mib": {"type": "integer", "minimum": 64},
                "fs_uuid": {"type": "string", "pattern": "^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$"},
                "hash_seed": {"type": "string", "pattern": "^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$"},
                "source_date_epoch": {"type": "integer", "minimum": 0},
            },
        },
    },
}


class ProfileError(Exception):
    """A profile that cannot be built; the message names the file and the key."""


def profiles_dir():
    return Path(os.environ.get("VCA_IMAGE_PROFILES", Path(__file__).resolve().parents[2] / "profiles"))


def list_profiles(directory=None):
    directory = Path(directory or profiles_dir())
    return sorted(p.stem for p in directory.glob("*.yml"))


def _read(path):
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ProfileError("%s: no such profile" % path) from None
    except yaml.YAMLError as exc:
        raise ProfileError("%s: not valid YAML: %s" % (path, exc)) from None
    if not isinstance(data, dict):
        raise ProfileError("%s: a profile is a mapping of keys, got %s" % (path, type(data).__name__))
    return data


def merge(parent, child):
    out = dict(parent)
    for key, value in child.items():
        if key in ADDITIVE and isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _key_path(error):
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def _describe(error, origin):
    """One line for a schema error: the file that set the key, the key, what is wrong."""
    path = _key_path(error)
    top = str(error.absolute_path[0]) if error.absolute_path else None
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        known = ", ".join(sorted(error.schema.get("properties", {})))
        where = origin.get(extra[0] if not error.absolute_path else top, origin["(any)"])
        return "%s: unknown key %s%s (known here: %s)" % (
            where, ".".join([*map(str, error.absolute_path), extra[0]]) if error.absolute_path else extra[0],
            "" if len(extra) == 1 else " (and %s)" % ", ".join(extra[1:]), known)
    if error.validator == "contains":
        return "%s: %s: must include %s" % (origin.get(top, origin["(any)"]), path, error.schema["contains"]["const"])
    if error.validator == "required":
        return "%s: %s: %s" % (origin["(any)"], path, error.message)
    if error.validator == "pattern" and "description" in error.schema:
        return "%s: %s: %r is not %s" % (origin.get(top, origin["(any)"]), path, error.instance,
                                         error.schema["description"])
    return "%s: %s: %s" % (origin.get(top, origin["(any)"]), path, error.message)


def _extended(path, parent, shipped):
    """The file that `extends: parent` in the profile at path names: a profile beside it first,
    then one in the shipped profiles."""
    places = [path.parent]
    if shipped.resolve() != path.parent.resolve():
        places.append(shipped)
    for place in places:
        if (place / ("%s.yml" % parent)).is_file():
            return place / ("%s.yml" % parent)
    where = "%s (beside it)%s" % (path.parent, " or %s (the shipped profiles)" % shipped if len(places) > 1 else "")
    raise ProfileError("%s: extends: no profile %s: no %s.yml in %s" % (path, parent, parent, where))


def _own_overlays(path, data, base):
    """data with its overlays made absolute where they are relative to another directory than base
    (the one above the profile being loaded), so that build.py, which resolves them against base,
    finds a shipped profile's overlays under a profile of one's own too. Overlays relative to base
    stay as written: the shipped profiles' recipes name no absolute path."""
    home = path.parent.parent
    overlays = data.get("overlays")
    if not isinstance(overlays, list) or home.resolve() == base.resolve():
        return data
    return {**data, "overlays": [str((home / o).resolve()) if isinstance(o, str) else o for o in overlays]}


def load(name, directory=None, check_paths=True):
    """The merged, validated profile `name`: a name in the profiles directory, or a path to a
    .yml anywhere. `extends: NAME` is looked for beside the file that says it, then in the
    profiles directory (the shipped profiles)."""
    directory = Path(directory or profiles_dir())
    chain, origin = [], {}
    path = Path(name) if name.endswith(".yml") else directory / ("%s.yml" % name)
    while True:
        if path.resolve() in [p.resolve() for p in chain]:
            loop = " -> ".join(str(p) for p in [*chain, path])
            raise ProfileError("%s: extends loop: %s" % (chain[-1], loop))
        chain.append(path)
        data = _read(path)
        for key in data:
            origin.setdefault(key, str(path))        # the most derived file that sets a key
        if "extends" not in data:
            break
        if not isinstance(data["extends"], str) or not re.match(r"^[A-Za-z0-9._-]+$", data["extends"]):
            raise ProfileError("%s: extends: must name a profile (in %s or %s)" % (path, path.parent, directory))
        path = _extended(path, data["extends"], directory)
    merged = {}
    base = chain[0].parent.parent
    for p in reversed(chain):
        data = {k: v for k, v in _read(p).items() if k != "abstract" or p == chain[0]}
        merged = merge(merged, _own_overlays(p, data, base))
    merged.pop("extends", None)
    if merged.pop("abstract", False):
        raise ProfileError("%s: abstract: true: it is extended by other profiles, not built on its own" % chain[0])
    merged["name"] = chain[0].stem if "name" not in _read(chain[0]) else merged["name"]
    origin["(any)"] = str(chain[0])
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(merged), key=lambda e: list(e.absolute_path))
    if errors:
        raise ProfileError("\n".join(_describe(e, origin) for e in errors))
    if check_paths:
        _check_paths(merged, base, origin)   # overlays: relative to the directory above chain[0], or absolute
    merged["_files"] = [str(p) for p in chain]
    return merged


def _check_paths(profile, base, origin):
    kernel = profile["kernel"]
    where = origin.get("kernel", origin["(any)"])
    if kernel["source"] == "debs_dir":
        for key in ("debs_dir", "version", "names"):
            if key not in kernel:
                raise ProfileError("%s: kernel.%s is required when kernel.source is debs_dir" % (where, key))
        expanded = os.path.expandvars(kernel["debs_dir"])
        if not expanded.strip() or "$" in expanded:
            raise ProfileError("%s: kernel.debs_dir: %r names no directory (is VCA_KERNEL_DEBS set? the "
                               "node_image role sets it from node_image_kernel_debs_dir)" % (where, kernel["debs_dir"]))
        debs = Path(expanded)
        if not debs.is_dir():
            raise ProfileError("%s: kernel.debs_dir: %s is not a directory (Intel's VCA kernel packages are not "
                               "ours to ship: put them there)" % (where, debs))
        if "vca_userspace" not in kernel:
            raise ProfileError("%s: kernel.vca_userspace is required when kernel.source is debs_dir: Intel's node "
                               "packages (the VCA modules and the node agent) from kernel.debs_dir, by names, "
                               "version and agent_units (docs/SETUP.md)" % where)
    elif not kernel.get("packages"):
        raise ProfileError("%s: kernel.packages is required when kernel.source is distribution" % where)
    elif "vca_userspace" in kernel:
        raise ProfileError("%s: kernel.vca_userspace: Intel's node packages go with Intel's kernel "
                           "(kernel.source: debs_dir), not with the distribution's" % where)
    for overlay in profile.get("overlays", []):
        if not (base / overlay).is_dir():
            raise ProfileError("%s: overlays: %s is not a directory under %s" % (origin.get("overlays"), overlay, base))


def kernel_debs(profile):
    """Intel's .debs from kernel.debs_dir: the VCA kernel (kernel.names) and its node-side
    userspace (kernel.vca_userspace.names), each checked by name and version before use (on the
    file names, NAME_VERSION_ARCH.deb); every problem in one error."""
    kernel = profile["kernel"]
    debs = Path(os.path.expandvars(kernel["debs_dir"]))
    found = {}
    for deb in sorted(debs.glob("*.deb")):
        pkg, _, rest = deb.name.partition("_")
        version = rest.split("_")[0]
        found[pkg] = (version, deb)
    userspace = kernel.get("vca_userspace", {})
    wanted = [(name, kernel["version"], "kernel") for name in kernel["names"]]
    wanted += [(name, userspace["version"], "kernel.vca_userspace") for name in userspace.get("names", [])]
    problems = []
    for name, version, key in wanted:
        what = "Intel's VCA kernel" if key == "kernel" else "Intel's node-side VCA package (%s)" % key
        if name not in found:
            problems.append("%s: no %s_*.deb (%s)" % (debs, name, what))
        elif version == UNSET:
            problems.append("%s: %s.version is %s, a placeholder (this project does not know the version of "
                            "Intel's node packages): %s is version %s; if that is the release you mean, set "
                            "%s.version: %s in a profile of your own (docs/SETUP.md)"
                            % (profile.get("_files", ["the profile"])[0], key, UNSET, found[name][1],
                               found[name][0], key, found[name][0]))
        elif found[name][0] != version:
            problems.append("%s: %s is version %s, the profile asks for %s (%s.version)"
                            % (found[name][1], name, found[name][0], version, key))
    if problems:
        raise ProfileError("; ".join(problems))
    return [found[name][1] for name, _, _ in wanted]


def agent_units(profile):
    """The node agent's systemd units (kernel.vca_userspace.agent_units) the verifier checks: the
    image's /etc/vca-node.conf carries them as VCA_AGENT_UNITS=UNIT ...; [] without Intel's userspace."""
    return list(profile["kernel"].get("vca_userspace", {}).get("agent_units", []))
