#!/usr/bin/env bash
# benches/reports.sh: report ingestion at fleet rate against a 3-replica mesh of real `meshd`
# processes on loopback (issue 14 item 3, decision 0215). `meshctl init` and `meshctl apply` of a
# mesh of HOSTS machines `bench-NNNNN` (no modules, no hosts running), then per CHANGING share
# `meshctl bench --reports HOSTS --rate RATE --duration SECONDS --changing P`, then the cluster is
# stopped.
#
# Usage: benches/reports.sh [HOSTS [RATE [SECONDS [CHANGING...]]]]
#        defaults: 10000 hosts, 1000 reports/s, 60 s, changing 0 (then each further share given)
#   MESH_BIN_DIR=dir   use meshd/meshctl from dir instead of building target/release
#   KEEP=1             keep the temp dir (logs, data) instead of removing it
# Everything it starts it stops by PID (trap on EXIT); everything it writes is under one temp dir.

set -euo pipefail

hosts=${1:-10000}
rate=${2:-1000}
secs=${3:-60}
shift $(($# < 3 ? $# : 3))
changing=("$@")
[ ${#changing[@]} -eq 0 ] && changing=(0)

here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/reports-bench.XXXXXX")
pids=()

stop_pids() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for _ in $(seq 100); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}

on_exit() {
    stop_pids
    if [ "${KEEP:-0}" = 1 ]; then
        echo "reports: kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

free_base() { # a base port B with B+1..B+3 free (meshctl init's loopback layout)
    local b ok i
    for _ in $(seq 200); do
        b=$((20000 + RANDOM % 30000))
        ok=1
        for i in 1 2 3; do
            [ -n "$(ss -Hltnu "sport = :$((b + i))" 2>/dev/null)" ] && ok=0
        done
        if [ $ok = 1 ]; then
            echo "$b"
            return 0
        fi
    done
    echo "reports: no free base port found" >&2
    return 1
}

wait_until() { # wait_until SECONDS WHAT COMMAND...
    local secs=$1 what=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            echo "reports: $what not ready after ${secs}s; logs in $tmp (KEEP=1 keeps them)" >&2
            return 1
        fi
        sleep 0.2
    done
}

if [ -n "${MESH_BIN_DIR:-}" ]; then
    bins=$MESH_BIN_DIR
else
    echo "reports: building meshd and meshctl (release)" >&2
    (cd "$here" && cargo build --release --bin meshd --bin meshctl 2>"$tmp/build.log")
    bins=$here/target/release
fi
meshd=$bins/meshd
meshctl=$bins/meshctl

dir=$tmp/mesh
mkdir -p "$dir"
for i in $(seq -f '%05g' 1 "$hosts"); do
    printf '[machines.bench-%s]\naddress = "127.0.0.1"\n\n' "$i"
done >"$dir/mesh.toml"
# init takes at most 1,000 machines: it starts from the first, the apply brings the rest.
head -3 "$dir/mesh.toml" >"$dir/init.toml"
base=$(free_base)
"$meshctl" init --dir "$dir/m" --base-port "$base" -f "$dir/init.toml" >"$dir/init.log" 2>&1
for i in 1 2 3; do
    "$meshd" --config "$dir/m/replica-$i.toml" >"$dir/replica-$i.log" 2>&1 &
    pids+=($!)
done
ctx=(--context "$dir/m/context.toml")
wait_until 60 "mesh leader" sh -c "'$meshctl' --context '$dir/m/context.toml' status --json | grep -qE '\"leader\": *[0-9]'"
"$meshctl" "${ctx[@]}" apply -f "$dir/mesh.toml" --why "reports bench: $hosts machines" >"$dir/apply.log" 2>&1

echo "reports: $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), 3 meshd on 127.0.0.1, $hosts machines"
rc=0
for p in "${changing[@]}"; do
    echo "== --changing $p (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    one=0
    "$meshctl" "${ctx[@]}" bench --reports "$hosts" --rate "$rate" --duration "$secs" \
        --changing "$p" --dir "$dir/m" 2>"$dir/bench-$p.err" || one=$?
    grep -v '^meshctl bench --reports: \(issuing\|running\)' "$dir/bench-$p.err" || true
    echo "   meshctl bench exit $one (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    [ $one -ne 0 ] && rc=$one
    for i in 1 2 3; do
        echo "   replica $i RSS $(($(awk '/VmRSS/ {print $2}' "/proc/${pids[$((i - 1))]}/status") / 1024)) MiB"
    done
done
exit $rc
