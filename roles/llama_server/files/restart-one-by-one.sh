#!/bin/bash
# Restart this node's llama-servers one at a time: each unit is restarted and must answer
# GET /health with 200 (its model loaded) before the next one goes down, so the node's other
# servers, and (the handler runs one node at a time) every other node's, keep serving the lanes'
# documents in flight. Arguments: ADDRESS TIMEOUT_S UNIT:PORT...
set -uo pipefail
address=$1 timeout_s=$2
shift 2
systemctl daemon-reload
now_us() { echo "${EPOCHREALTIME/[.,]/}"; }    # microseconds (bash 5): SECONDS is whole seconds
for unit_port in "$@"; do
    unit=${unit_port%:*} port=${unit_port##*:}
    systemctl restart "$unit" || { systemctl status --no-pager "$unit" | tail -20; exit 1; }
    started=$(now_us)
    until curl -fsS -o /dev/null -m 5 "http://$address:$port/health"; do
        if (( $(now_us) - started >= timeout_s * 1000000 )); then
            echo "$unit: no 200 from http://$address:$port/health within $timeout_s s of its restart" >&2
            journalctl -u "$unit" -n 20 --no-pager >&2
            exit 1
        fi
        sleep 1
    done
    echo "$unit restarted, /health 200 after $(( ($(now_us) - started) / 1000000 )) s"
done
