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
healthy() {    # GET /health answers 200; bash's /dev/tcp, since a node has no curl
    timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3 \
        && read -r status <&3 && [[ $status == "HTTP/1."[01]" 200"* ]]' "$address" "$1" 2>/dev/null
}
for unit_port in "$@"; do
    unit=${unit_port%:*} port=${unit_port##*:}
    systemctl restart "$unit" || { systemctl status --no-pager "$unit" | tail -20; exit 1; }
    started=$(now_us)
    until healthy "$port"; do
        if (( $(now_us) - started >= timeout_s * 1000000 )); then
            echo "$unit: no 200 from http://$address:$port/health within $timeout_s s of its restart" >&2
            journalctl -u "$unit" -n 20 --no-pager >&2
            exit 1
        fi
        sleep 1
    done
    echo "$unit restarted, /health 200 after $(( ($(now_us) - started) / 1000000 )) s"
done
