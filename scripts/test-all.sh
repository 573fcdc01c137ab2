#!/usr/bin/env bash
# Runs every check `make test` promises and prints one summary line per step.
# Steps: yamllint, ansible-lint, ruff, the docs' references, pytest (tests/, then apps/vcamon/tests, apps/smem/tests, apps/farm/tests), the install
# steps proved in a throwaway bare-Debian container (fresh), each molecule scenario, then
# the node image (two builds bit-identical, a QEMU boot). When fresh runs too, the unit tests run
# once, in there: the same tests on a freshly bootstrapped machine, which is the stricter place.
# With arguments, only those groups run: lint, unit, fresh, molecule, image.
# Two lanes: fresh, image and the molecule scenarios in VCA_TEST_BESIDE_SCENARIOS run beside the
# other scenarios (build/test-beside.log), since one molecule scenario keeps about 1.5 of the 2 cores
# busy and the image's builds and boots mostly one; the scenarios moved over even out the lanes'
# lengths. Their caches are their own (fresh and the scenarios beside: the fresh apt archives, one
# after the other; image: its build cache), so no lane takes another's apt lock or reads a
# half-written download. VCA_TEST_LANES=1 runs everything in one lane.
set -uo pipefail
cd "$(dirname "$0")/.."
groups=${*:-lint unit fresh molecule image}
all_groups=" $groups "
scripts/preflight.sh ${groups/fresh/molecule} || exit 1

results=()
failed=0
passed=0
# Each step's output also goes to build/steps/<step>.log; a failed one's summary line is followed by
# what says why (pytest's FAILED lines, Ansible's fatal ones, molecule's idempotence list): the
# summary alone tells which test broke.
step() {
    local name=$1; shift
    local start=$SECONDS log out tee_pid rc
    log=build/steps/${name//[^A-Za-z0-9_.-]/_}.log
    mkdir -p build/steps
    echo "=== $name: $*"
    exec {out}> >(tee "$log")
    tee_pid=$!
    "$@" >&"$out" 2>&1    # in this shell, not a pipeline's: a step may export what later ones use
    rc=$?
    exec {out}>&-
    wait "$tee_pid" 2>/dev/null    # the log whole before it is read
    if [ "$rc" -eq 0 ]; then
        results+=("PASS  $name ($((SECONDS - start)) s)")
        passed=$((passed + 1))
    else
        results+=("FAIL  $name ($((SECONDS - start)) s)")
        failed=$((failed + 1))
        [ "${STEP_WHY:-yes}" = no ] && return
        while IFS= read -r line; do results+=("      why: $line"); done < <(why_failed "$log" | cut -c1-300 | head -n 8)
    fi
}

# The lines that name what failed (pytest's FAILED lines and failure headers, Ansible's fatal and
# ERROR! ones, molecule's idempotence list), and pytest's exception lines, which say why.
why_failed() {
    sed 's/\x1b\[[0-9;]*m//g' "$1" \
        | grep -E '^(FAILED |ERROR!? |fatal: |failed: \[|CRITICAL |\* \[)|^_{3,} test[^ ]* _{3,}$|^E +[A-Za-z.]+(Error|Exception)\b' \
        | grep -vE '^FAILED - RETRYING|UNREACHABLE! =>$|\.\.\.ignoring$'
}

# The steps of the last summary in a log (a lane's, or the fresh machine's), with their why lines.
summary_in() {
    awk '/^=== make test summary/ {last = ""; next} {last = last $0 "\n"} END {printf "%s", last}' "$1" 2>/dev/null \
        | grep -E '^ *(PASS|FAIL)  |^ +why: '
}

# smem's tests run against a real llama-server and the lab's model (both cached by content hash).
llama_server_env() {
    SMEM_LLAMA_SERVER=$(scripts/llama-server.sh) && SMEM_TEST_GGUF=$(scripts/lab-models.sh) \
        && export SMEM_LLAMA_SERVER SMEM_TEST_GGUF
}

# docs/EXPOSURE.md is made from the roles' declarations: a check run that would change it fails.
exposure_doc_current() {
    local out
    out=$(ansible-playbook -i inventory/production playbooks/exposure.yml --tags doc --check) || { echo "$out"; return 1; }
    grep -Eq '^localhost +: .*changed=0 ' <<<"$out" && return 0
    echo "docs/EXPOSURE.md is out of date: ansible-playbook -i inventory/production playbooks/exposure.yml --tags doc"
    return 1
}

# A scenario with an image.sh runs on the image it prints (the lab image with its prepare's packages
# already in, made once and kept): the time to make it, when it is made, counts in the scenario's.
molecule_test() {
    local image=$VCA_LAB_IMAGE
    if [ -x "molecule/$1/image.sh" ]; then
        image=$("molecule/$1/image.sh" "$VCA_LAB_IMAGE") || return 1
    fi
    VCA_LAB_IMAGE=$image molecule -c molecule/base.yml test -s "$1"
}

beside=""
if [[ "${VCA_TEST_LANES:-2}" != 1 && "$all_groups" == *" molecule "* ]]; then
    for g in fresh image; do
        [[ "$all_groups" == *" $g "* ]] && beside+=" $g" && groups=$(echo " $groups " | sed "s/ $g / /")
    done
fi
if [ -n "$beside" ]; then
    mkdir -p build
    # the docker-driver scenarios and vcamon's lab (each lab has its own name, LAN and state directory;
    # no lab mounts an apt cache), about 1,300 s of the molecule lane
    beside_scenarios=${VCA_TEST_BESIDE_SCENARIOS-common node_base power_cap probes vca_boot vca_host vcamon}
    echo "=== beside molecule:$beside${beside_scenarios:+ and molecule: $beside_scenarios} (log: build/test-beside.log, printed at the end)"
    VCA_TEST_LANES=1 VCA_MOLECULE_ONLY="$beside_scenarios" VCA_APT_ARCHIVES=/var/cache/vcafleet/apt-archives-fresh \
        scripts/test-all.sh $beside ${beside_scenarios:+molecule} > build/test-beside.log 2>&1 &
    beside_pid=$!
    export VCA_MOLECULE_SKIP="$beside_scenarios"
fi

for g in $groups; do
    case $g in
    lint)
        step yamllint yamllint --strict .
        step ansible-lint ansible-lint --profile production
        step ruff ruff check .
        step exposure-doc exposure_doc_current
        step doc-refs python3 scripts/check-doc-refs.py    # every path, playbook and tag the docs name exists
        ;;
    unit)
        if [[ "$all_groups" == *" fresh "* ]]; then
            echo "=== unit: the unit tests run once, inside fresh-machine, on a freshly bootstrapped Debian"
            continue
        fi
        step llama-server llama_server_env
        step pytest pytest -q -m "not netns" tests
        step vcamon-tests pytest -q apps/vcamon/tests
        step smem-tests pytest -q apps/smem/tests
        step farm-tests pytest -q -n 2 apps/farm/tests    # two at a time: they mostly wait (heartbeats, stalls)
        ;;
    molecule)
        VCA_LAB_IMAGE=$(lab/image/build.sh) || exit 1
        export VCA_LAB_IMAGE
        lan=0
        for scenario in $(ls molecule/*/molecule.yml | xargs -n1 dirname | xargs -n1 basename | sort); do
            # each lab its own LAN, by its place among all scenarios (so the two lanes differ too):
            # Docker's own pick, after many labs on one engine, can be 172.31.0.0/16, the nodes'
            # network (playbooks/lab.yml refuses it)
            lan=$((lan + 1))
            if [[ -n "${VCA_MOLECULE_ONLY+set}" && " $VCA_MOLECULE_ONLY " != *" $scenario "* ]] \
                || [[ " ${VCA_MOLECULE_SKIP:-} " == *" $scenario "* ]]; then
                continue
            fi
            export VCA_LAB_LAN_SUBNET=${VCA_LAB_LAN_PREFIX:-10.231}.$lan.0/24
            step "molecule:$scenario" molecule_test "$scenario"
        done
        unset VCA_LAB_LAN_SUBNET
        ;;
    image)
        step image scripts/image-test.sh
        step dma-kernel scripts/dma-kernel-test.sh    # vca_dma in Debian's kernel under QEMU, ~50 s
        step netns-firewall pytest -q -m netns tests  # two hosts' rules in network namespaces (root, caps)
        ;;
    fresh)
        STEP_WHY=no step fresh-machine scripts/fresh-check.sh    # its failed steps say why, below
        # the steps make unit ran in there, with their times
        while IFS= read -r line; do results+=("  $line"); done < <(
            summary_in build/fresh-check.log | sed 's/^\(PASS\|FAIL\)  /&fresh:/')
        ;;
    *) echo "unknown group $g (lint, unit, fresh, molecule, image)" >&2; exit 2 ;;
    esac
done

if [ -n "$beside" ]; then
    wait "$beside_pid"
    beside_rc=$?
    echo "=== beside molecule:$beside: its log"
    cat build/test-beside.log
    beside_failed=0
    while IFS= read -r line; do    # the fresh machine's own steps stay indented, as above
        results+=("$line")
        [[ $line == FAIL* ]] && failed=$((failed + 1)) && beside_failed=1
        [[ $line == PASS* ]] && passed=$((passed + 1))
    done < <(summary_in build/test-beside.log)   # its own summary: the last one (fresh's log has one)
    # a lane that stopped before its own summary (fresh's is in its log too) fails here
    if [ "$beside_rc" -ne 0 ] && [ "$beside_failed" = 0 ]; then
        results+=("FAIL  beside ($beside: exit $beside_rc before its summary; see build/test-beside.log)")
        failed=$((failed + 1))
    fi
fi

echo
echo "=== make test summary"
printf '%s\n' "${results[@]}"
echo "summary: $passed passed, $failed failed"
echo "wall time: $SECONDS s (the lanes overlap: the steps' times add up to more)"
[ "$failed" -eq 0 ]
