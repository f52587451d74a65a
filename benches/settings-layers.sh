#!/usr/bin/env bash
# benches/settings-layers.sh: `meshctl bench --load L` (500 clients at `l`) against 3 real meshd
# on loopback whose model has M machines, so the clients' keys share M settings layers (issue 26
# item 2, decision 0317): with M = 4, as on `meshctl dev`, about 125 keys per layer; with M = 500,
# as in benches/side-by-side.sh, one. A write should cost what it changes, so both should be close.
#
# Usage: benches/settings-layers.sh [M...]      (default: 4 500)
#   MESH_BIN_DIR=dir   meshd/meshctl from dir (default: target/release, built if missing)
#   LOAD=l             the bench load (s, m, l, xl)
#   KEEP=1             keep the temp dir (logs, data)
#   PROFILE=1          20 s into each bench, sample the 3 meshd for 20 s with `perf record -e
#                      cpu-clock` (DWARF call graphs) and print the functions with the most CPU,
#                      self and inclusive; the data stays in the temp dir (with KEEP=1)
# Everything it starts it stops by PID; everything it writes is under one temp dir.

set -euo pipefail

counts=("$@")
[ ${#counts[@]} -eq 0 ] && counts=(4 500)
load=${LOAD:-l}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/settings-layers.XXXXXX")
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
    if [ "${KEEP:-0}" = 1 ]; then echo "settings-layers: kept $tmp" >&2; else rm -rf "$tmp"; fi
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
        [ $ok = 1 ] && { echo "$b"; return 0; }
    done
    echo "settings-layers: no free base port found" >&2
    return 1
}

# shellcheck source=benches/cpu.sh
. "$here/benches/cpu.sh"

wait_until() { # wait_until SECONDS WHAT COMMAND...
    local secs=$1 what=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            echo "settings-layers: $what not ready after ${secs}s; KEEP=1 keeps the logs" >&2
            return 1
        fi
        sleep 0.2
    done
}

bins=${MESH_BIN_DIR:-$here/target/release}
if [ -z "${MESH_BIN_DIR:-}" ] && [ ! -x "$bins/meshctl" ]; then
    (cd "$here" && cargo build --release --locked --bin meshd --bin meshctl)
fi
meshd=$bins/meshd
meshctl=$bins/meshctl

for m in "${counts[@]}"; do
    dir=$tmp/mesh-$m
    mkdir -p "$dir"
    for i in $(seq -w 1 "$m"); do
        printf '[machines.bench-%s]\naddress = "127.0.0.1"\n\n' "$i"
    done >"$dir/mesh.toml"
    base=$(free_base)
    "$meshctl" init --dir "$dir/m" --base-port "$base" -f "$dir/mesh.toml" >"$dir/init.log" 2>&1
    for i in 1 2 3; do
        "$meshd" --config "$dir/m/replica-$i.toml" >"$dir/replica-$i.log" 2>&1 &
        pids+=($!)
    done
    ctx=(--context "$dir/m/context.toml")
    wait_until 60 "mesh leader" sh -c "'$meshctl' --context '$dir/m/context.toml' status --json | grep -qE '\"leader\": *[0-9]'"
    "$meshctl" "${ctx[@]}" apply -f "$dir/mesh.toml" --why "settings-layers: $m machines" >"$dir/apply.log" 2>&1
    echo "== $m layers: meshctl bench --load $load, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg), binaries $bins"
    rc=0
    before=$(cpu_ms "${pids[@]}")
    perf_pid=""
    if [ "${PROFILE:-0}" = 1 ]; then
        # cpu-clock is a software event (no hardware counters here); DWARF call graphs, as
        # release builds keep no frame pointers. Started by PID, stopped when it has slept.
        (sleep 20 && exec perf record -q -e cpu-clock -F 99 --call-graph dwarf,16384 \
            -o "$dir/perf.data" -p "$(IFS=,; echo "${pids[*]}")" -- sleep 20) \
            >"$dir/perf.log" 2>&1 &
        perf_pid=$!
    fi
    "$meshctl" "${ctx[@]}" bench --load "$load" >"$dir/bench.out" 2>"$dir/bench.err" || rc=$?
    servers_ms=$(($(cpu_ms "${pids[@]}") - before))
    if [ -n "$perf_pid" ]; then
        wait "$perf_pid" 2>/dev/null || true
        perf report -i "$dir/perf.data" --no-children --stdio --sort symbol --percent-limit 0.7 \
            -g none 2>/dev/null | grep '%' | sed -E 's/ +(- +)*$//' >"$dir/self.txt" || true
        # Inclusive: ours and the crates and syscalls under them, not the runtime's frames.
        perf report -i "$dir/perf.data" --children --stdio --sort symbol --percent-limit 1.5 \
            -g none 2>/dev/null | grep '%' | sed -E 's/ +(- +)*$//' |
            grep -E 'mesh|openraft|redb|quinn|rustls|bincode|fsync|sendmsg|recvmsg|pwrite' \
            >"$dir/children.txt" || true
    fi
    cat "$dir/bench.out"
    grep -v '^meshctl bench: running' "$dir/bench.err" || true
    echo "   meshctl bench exit $rc"
    # CPU per write: the 3 meshd's user + system while the bench ran, over the writes it counted.
    ok=$(grep -oE '\(([0-9]+) ok' "$dir/bench.out" | grep -oE '[0-9]+' | head -1 || true)
    if [ -n "$ok" ] && [ "$ok" -gt 0 ]; then
        echo "   servers' CPU: ${servers_ms} ms for $ok writes, $((servers_ms * 1000 / ok)) µs per write"
    fi
    if [ -s "$dir/children.txt" ]; then
        echo "-- the 3 meshd, perf cpu-clock samples: inclusive (children, self), over 1.5 %"
        head -40 "$dir/children.txt"
        echo "-- self, over 0.7 %"
        head -40 "$dir/self.txt"
    fi
    stop_pids
done
