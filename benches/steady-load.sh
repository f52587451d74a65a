#!/usr/bin/env bash
# benches/steady-load.sh: does the leadership hold under load? (issue 26 item 3, decision 0328)
# Three real `meshd` on loopback (`meshctl init`, one machine per client as in side-by-side.sh,
# default replica.toml), `meshctl bench --load L --duration SECONDS`, then the leader changes
# during the bench: the "leader of term" lines the three replicas logged after the bench began,
# and the leader and epochs (terms) `meshctl status` named before and after.
#
# Usage: benches/steady-load.sh [LOAD [SECONDS]]    LOAD s, m, l or xl (default l), SECONDS 1-600
#                                                    (default 600)
#   MESH_BIN_DIR=dir   meshd and meshctl from dir (default: target/release of this tree, built
#                      with `cargo build --release --bin meshd --bin meshctl` if missing)
#   KEEP=1             keep the temp dir (replica logs, bench output)
# Disk: every settings write keeps its layer before and after in the history (issue 26 item 2), so
# at load l the three stores grew by ~67 MB/s together (2026-12-06: 20 GB in 300 s, when the disk
# filled and all three replicas stopped). It refuses to start without 70 MB per second of run free
# under TMPDIR (42 GB for 600 s at load l).
# Stops what it started by PID (trap on EXIT); writes only under one temp dir.

set -euo pipefail

load=${1:-l}
secs=${2:-600}
case "$load" in s) machines=50 ;; m) machines=200 ;; l) machines=500 ;; xl) machines=1000 ;; *)
    echo "steady-load: unknown load '$load'; use s, m, l or xl" >&2
    exit 2
    ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
bins=${MESH_BIN_DIR:-$here/target/release}
if [ ! -x "$bins/meshd" ] || [ ! -x "$bins/meshctl" ]; then
    (cd "$here" && cargo build --release --bin meshd --bin meshctl)
fi
need_mb=$((secs * 70))
free_mb=$(df -Pm "${TMPDIR:-/tmp}" | awk 'NR == 2 { print $4 }')
if [ "$free_mb" -lt "$need_mb" ]; then
    echo "steady-load: $free_mb MB free under ${TMPDIR:-/tmp}, $need_mb MB needed for $secs s; run shorter or free space" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/steady-load.XXXXXX")
pids=()

on_exit() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "${KEEP:-0}" = 1 ]; then echo "steady-load: kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

free_base() { # a base port B with B+1..B+3 free (meshctl init's loopback layout)
    local b ok i
    for _ in $(seq 200); do
        b=$((20000 + RANDOM % 30000))
        ok=1
        for i in 1 2 3; do [ -n "$(ss -Hltnu "sport = :$((b + i))" 2>/dev/null)" ] && ok=0; done
        if [ $ok = 1 ]; then echo "$b"; return 0; fi
    done
    echo "steady-load: no free base port" >&2
    return 1
}

leader_lines() { # the "leader of term" lines of the three replica logs
    cat "$tmp"/replica-{1,2,3}.log 2>/dev/null | grep -c "leader of term" || true
}

status() { "$bins/meshctl" --context "$tmp/m/context.toml" status --json 2>/dev/null | tr -d '\n ' |
    grep -oE '"(leader|epoch)":[0-9]+' | tr '\n' ' '; }

for i in $(seq -w 1 "$machines"); do
    printf '[machines.bench-%s]\naddress = "127.0.0.1"\n\n' "$i"
done >"$tmp/mesh.toml"
"$bins/meshctl" init --dir "$tmp/m" --base-port "$(free_base)" -f "$tmp/mesh.toml" >"$tmp/init.log" 2>&1
for i in 1 2 3; do
    "$bins/meshd" --config "$tmp/m/replica-$i.toml" >"$tmp/replica-$i.log" 2>&1 &
    pids+=($!)
done
end=$((SECONDS + 60))
until "$bins/meshctl" --context "$tmp/m/context.toml" status --json 2>/dev/null | grep -qE '"leader": *[0-9]'; do
    [ $SECONDS -ge $end ] && { echo "steady-load: no leader within 60 s" >&2; exit 1; }
    sleep 0.5
done
"$bins/meshctl" --context "$tmp/m/context.toml" apply -f "$tmp/mesh.toml" --why "steady-load: $machines machines" >"$tmp/apply.log" 2>&1
before_lines=$(leader_lines)
before_status=$(status)
echo "steady-load: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), nproc $(nproc); before: $before_status"
rc=0
"$bins/meshctl" --context "$tmp/m/context.toml" bench --load "$load" --duration "$secs" >"$tmp/bench.out" 2>"$tmp/bench.err" || rc=$?
after_lines=$(leader_lines)
after_status=$(status)
grep -v '^meshctl bench: running' "$tmp/bench.err" || true
cat "$tmp/bench.out"
echo "steady-load: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg); after: $after_status"
echo "steady-load: meshctl bench exit $rc; leader changes during the bench: $((after_lines - before_lines)) (\"leader of term\" lines: $before_lines before, $after_lines after)"
cat "$tmp"/replica-{1,2,3}.log | grep "leader of term" || true
