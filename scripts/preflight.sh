#!/usr/bin/env bash
# Before `make test` or `make lab` does anything: every external program the code
# runs is here (scripts/host-packages.txt), or one line per missing program names
# the package that provides it. Exit 1 if anything is missing.
# Usage: preflight.sh [GROUP...]   (default: every group)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
groups=${*:-lint unit molecule image lab}

missing=0
while read -r package programs needed_by; do
    wanted=0
    for g in $groups; do [[ ",$needed_by," == *",$g,"* ]] && wanted=1; done
    [ "$wanted" = 1 ] || continue
    IFS=, read -ra checks <<<"$programs"
    for check in "${checks[@]}"; do
        case $check in
        -) dpkg-query -W -f '${db:Status-Abbrev}' "$package" 2>/dev/null | grep -q '^ii' && continue
           echo "preflight: package $package is not installed (needed by: $needed_by)" ;;
        py:*) python3 -c "import ${check#py:}" 2>/dev/null && continue
           echo "preflight: python3 module ${check#py:} is missing: install $package (needed by: $needed_by)" ;;
        *) command -v "$check" >/dev/null 2>&1 && continue
           echo "preflight: $check is missing: install $package (needed by: $needed_by)" ;;
        esac
        missing=$((missing + 1))
    done
done < <(grep -Ev '^\s*(#|$)' "$here/host-packages.txt")

if [[ " $groups " == *" molecule "* || " $groups " == *" lab "* ]] && command -v docker >/dev/null 2>&1 \
    && ! docker info >/dev/null 2>&1; then
    echo "preflight: no Docker engine answers (scripts/bootstrap-host.sh starts dockerd)"
    missing=$((missing + 1))
fi
if [ "$missing" -gt 0 ]; then
    echo "preflight: $missing missing; run scripts/bootstrap-host.sh (as root) or install the packages named" >&2
    exit 1
fi
echo "preflight: ok ($groups)"
