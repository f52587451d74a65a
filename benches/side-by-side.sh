#!/usr/bin/env bash
# benches/side-by-side.sh: etcd and mesh measured on the same machine in the same run, through
# the same kind of interface (decision 0120). Per load: a 3-member etcd on loopback with mutual
# TLS, `etcdctl check perf --load=L`, etcd stopped; then a 3-replica mesh of real `meshd`
# processes on loopback (`meshctl init` with one machine per client, `meshctl apply`),
# `meshctl bench --load L`, mesh stopped; then both figures and mesh/etcd ratios.
#
# Usage: benches/side-by-side.sh [LOAD...]     LOAD is s, m, l or xl (default: s)
#   MESH_BIN_DIR=dir   use meshd/meshctl from dir instead of building target/release
#   KEEP=1             keep the temp dir (logs, data) instead of removing it
#   PROFILE=1          sample the 3 meshd with `perf record -e cpu-clock` while the bench runs and
#                      print where their CPU went (functions, then threads); the data stays in
#                      the temp dir (with KEEP=1) for `perf report -i .../perf.data`
# Installs Debian's etcd-server and etcd-client with apt-get when etcd or etcdctl is missing.
# Everything it starts it stops by PID (trap on EXIT); everything it writes is under one temp dir.

set -euo pipefail

loads=("$@")
[ ${#loads[@]} -eq 0 ] && loads=(s)
for l in "${loads[@]}"; do
    case "$l" in s | m | l | xl) ;; *)
        echo "side-by-side: unknown load '$l'; use s, m, l or xl" >&2
        exit 2
        ;;
    esac
done

here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/side-by-side.XXXXXX")
pids=()

stop_pids() {
    # TERM every process still recorded, wait up to 10 s, then KILL what is left.
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
        echo "side-by-side: kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# free_port: sets $port to a TCP and UDP port nobody listens on now and this run has not handed
# out (QUIC is UDP, etcd is TCP). Not called in a subshell, so $taken keeps what it handed out.
taken=" "
free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        case "$taken" in *" $p "*) continue ;; esac
        if [ -z "$(ss -Hltnu "sport = :$p" 2>/dev/null)" ]; then
            taken="$taken$p "
            port=$p
            return 0
        fi
    done
    echo "side-by-side: no free port found" >&2
    return 1
}

# A base port B with B+1..B+3 free for the replicas (meshctl init's loopback layout).
free_base() {
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
    echo "side-by-side: no free base port found" >&2
    return 1
}

# shellcheck source=benches/cpu.sh
. "$here/benches/cpu.sh"

# timed_client OUT CMD...: runs the benchmark client, its output to OUT, its own CPU time
# (user + system, /usr/bin/time) to OUT.cpu in milliseconds; returns the client's exit code.
timed_client() {
    local out=$1 rc=0
    shift
    /usr/bin/time -f '%U %S' -o "$out.time" "$@" >"$out" 2>"$out.err" || rc=$?
    awk '{ printf "%d", ($1 + $2) * 1000 }' "$out.time" >"$out.cpu"
    return $rc
}

wait_until() { # wait_until SECONDS WHAT COMMAND...
    local secs=$1 what=$2
    shift 2
    local end=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $end ]; then
            echo "side-by-side: $what not ready after ${secs}s; logs in $tmp (KEEP=1 keeps them)" >&2
            return 1
        fi
        sleep 0.2
    done
}

if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
    echo "side-by-side: installing etcd-server and etcd-client" >&2
    sudo_=""
    [ "$(id -u)" -ne 0 ] && sudo_=sudo
    $sudo_ apt-get install -y etcd-server etcd-client >"$tmp/apt.log" 2>&1 || {
        $sudo_ apt-get update >>"$tmp/apt.log" 2>&1
        $sudo_ apt-get install -y etcd-server etcd-client >>"$tmp/apt.log" 2>&1
    }
fi

if [ -n "${MESH_BIN_DIR:-}" ]; then
    bins=$MESH_BIN_DIR
else
    echo "side-by-side: building meshd and meshctl (release)" >&2
    (cd "$here" && { cargo build --release --locked --bin meshd --bin meshctl 2>"$tmp/build.log" ||
        cargo build --release --offline --bin meshd --bin meshctl 2>>"$tmp/build.log"; })
    bins=$here/target/release
fi
meshd=$bins/meshd
meshctl=$bins/meshctl
if [ -n "${MESH_BIN_DIR:-}" ]; then
    mesh_from="binaries from $MESH_BIN_DIR"
else
    mesh_from="built from $(git -C "$here" describe --always --dirty 2>/dev/null || echo '?')"
fi

# The etcd PKI: one CA, one certificate for the members (server and peer), one for the client.
pki=$tmp/etcd-pki
mkdir -p "$pki"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=side-by-side-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
leaf() { # leaf NAME EKU
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=$1" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=%s\n' "$2" >"$pki/$1.ext"
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
        -CAcreateserial -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
}
leaf member serverAuth,clientAuth
leaf client clientAuth

# by_crate SELF: perf's self samples per symbol summed by crate (the path's first segment; the
# kernel, and libc/allocator symbols, as one line each), highest first.
by_crate() {
    python3 - "$1" <<'PY'
import collections, re, sys
total = collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    share, kind, symbol = float(m.group(1)), m.group(2), m.group(3).strip()
    if kind == "k":
        crate = "kernel"
    else:
        name = symbol.lstrip("<").replace("_<", "")
        path = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
        crate = path.group(1) if path else "libc, allocator, other"
    total[crate] += share
for crate, share in total.most_common(20):
    print(f"   {share:6.2f} %  {crate}")
PY
}

run_etcd() { # run_etcd LOAD → prints etcdctl's output, sets etcd_rc
    local load=$1 i eps="" cluster="" dir=$tmp/etcd-$1
    local -a cport pport
    mkdir -p "$dir"
    for i in 1 2 3; do
        free_port
        cport[i]=$port
        free_port
        pport[i]=$port
        cluster="${cluster:+$cluster,}m$i=https://127.0.0.1:${pport[i]}"
        eps="${eps:+$eps,}https://127.0.0.1:${cport[i]}"
    done
    for i in 1 2 3; do
        etcd --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "https://127.0.0.1:${cport[i]}" \
            --advertise-client-urls "https://127.0.0.1:${cport[i]}" \
            --listen-peer-urls "https://127.0.0.1:${pport[i]}" \
            --initial-advertise-peer-urls "https://127.0.0.1:${pport[i]}" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "side-by-side-$load" \
            --cert-file "$pki/member.crt" --key-file "$pki/member.key" \
            --trusted-ca-file "$pki/ca.crt" --client-cert-auth \
            --peer-cert-file "$pki/member.crt" --peer-key-file "$pki/member.key" \
            --peer-trusted-ca-file "$pki/ca.crt" --peer-client-cert-auth \
            >"$dir/m$i.log" 2>&1 &
        pids+=($!)
    done
    local ctl=(env ETCDCTL_API=3 etcdctl --endpoints="$eps" --cacert "$pki/ca.crt"
        --cert "$pki/client.crt" --key "$pki/client.key")
    wait_until 60 "etcd" "${ctl[@]}" endpoint health
    etcd_rc=0
    local before
    before=$(cpu_ms "${pids[@]}")
    timed_client "$dir/perf.out" "${ctl[@]}" check perf --load="$load" || etcd_rc=$?
    echo $(($(cpu_ms "${pids[@]}") - before)) >"$dir/servers.cpu"
    cat "$dir/perf.out.err" >>"$dir/perf.out"
    # The progress bar redraws with carriage returns; keep the verdict lines.
    tr '\r' '\n' <"$dir/perf.out" | grep -E 'PASS|FAIL|Slowest|Stddev|Throughput|rror' || true
    stop_pids
}

run_mesh() { # run_mesh LOAD → prints meshctl bench's output, sets mesh_rc
    local load=$1 dir=$tmp/mesh-$1 base machines i
    case "$load" in s) machines=50 ;; m) machines=200 ;; l) machines=500 ;; xl) machines=1000 ;; esac
    mkdir -p "$dir"
    # One machine per client, so each client writes its own layer: a settings write copies its
    # layer into the history, and a layer shared by many clients would measure that copy.
    for i in $(seq -w 1 "$machines"); do
        printf '[machines.bench-%s]\naddress = "127.0.0.1"\n\n' "$i"
    done >"$dir/mesh.toml"
    base=$(free_base)
    "$meshctl" init --dir "$dir/m" --base-port "$base" -f "$dir/mesh.toml" >"$dir/init.log" 2>&1
    for i in 1 2 3; do
        "$meshd" --config "$dir/m/replica-$i.toml" >"$dir/replica-$i.log" 2>&1 &
        pids+=($!)
    done
    local ctx=(--context "$dir/m/context.toml")
    wait_until 60 "mesh leader" sh -c "'$meshctl' --context '$dir/m/context.toml' status --json | grep -qE '\"leader\": *[0-9]'"
    "$meshctl" "${ctx[@]}" apply -f "$dir/mesh.toml" --why "side-by-side: $machines machines" >"$dir/apply.log" 2>&1
    mesh_rc=0
    local before
    before=$(cpu_ms "${pids[@]}")
    local perf_pid=""
    if [ "${PROFILE:-0}" = 1 ]; then
        # cpu-clock is a software event: it samples where hardware counters are not offered.
        # DWARF call graphs: release builds keep no frame pointers.
        perf record -q -e cpu-clock -F 199 --call-graph dwarf,16384 -o "$dir/perf.data" \
            -p "$(IFS=,; echo "${pids[*]}")" >"$dir/perf.log" 2>&1 &
        perf_pid=$!
    fi
    timed_client "$dir/bench.out" "$meshctl" "${ctx[@]}" bench --load "$load" || mesh_rc=$?
    echo $(($(cpu_ms "${pids[@]}") - before)) >"$dir/servers.cpu"
    if [ -n "$perf_pid" ]; then
        kill -INT "$perf_pid" 2>/dev/null || true
        wait "$perf_pid" 2>/dev/null || true
        perf report -i "$dir/perf.data" --no-children --stdio --sort symbol \
            --percent-limit 0 -g none 2>/dev/null | grep '%' >"$dir/self.txt" || true
        by_crate "$dir/self.txt" >"$dir/profile.txt"
        echo "-- inclusive (with what they call), ours and the crates under them, over 2 %" >>"$dir/profile.txt"
        perf report -i "$dir/perf.data" --children --stdio --sort symbol --percent-limit 2 \
            -g none 2>/dev/null | grep '%' |
            grep -E 'mesh|openraft|redb|quinn|rustls|bincode|write_batch|apply' |
            sed -E 's/ +- +- *$//' | head -40 >>"$dir/profile.txt" || true
        perf report -i "$dir/perf.data" --no-children --stdio --sort comm \
            -g none 2>/dev/null | grep '%' >"$dir/threads.txt" || true
    fi
    mv "$dir/bench.out.err" "$dir/bench.err"
    cat "$dir/bench.out"
    [ -s "$dir/bench.err" ] && grep -v '^meshctl bench: running' "$dir/bench.err" || true
    if [ -s "$dir/profile.txt" ]; then
        echo "-- where the 3 meshd spent their CPU (perf cpu-clock samples, self, by crate)"
        cat "$dir/profile.txt"
        echo "-- by thread"
        head -20 "$dir/threads.txt"
    fi
    stop_pids
}

# Numbers out of the two outputs.
etcd_rate() { grep -oE '[0-9]+ writes/s' "$1" | head -1 | grep -oE '^[0-9]+'; }
etcd_slowest() { grep -oE 'Slowest request took[^0-9]*[0-9.]+s' "$1" | grep -oE '[0-9.]+s$' | tr -d s; }
etcd_stddev() { grep -oE 'Stddev[^0-9]*[0-9.]+s' "$1" | grep -oE '[0-9.]+s$' | tr -d s; }
mesh_field() { grep -oE "$2 [0-9.]+" "$1" | head -1 | awk '{print $NF}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }'; }

echo "side-by-side: $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(etcd --version | head -1), mesh $mesh_from"
summary=""
cpu_summary=""
# CPU per write: both tools write for 60 s at every load, so writes = rate × 60.
per_write() { awk -v ms="$1" -v r="$2" 'BEGIN { if (r > 0) printf "%.0f", ms * 1000 / (r * 60); else print "-" }'; }
for load in "${loads[@]}"; do
    echo "== load $load: etcd (3 members, mutual TLS), etcdctl check perf --load=$load (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    run_etcd "$load"
    echo "   etcdctl exit $etcd_rc"
    echo "== load $load: mesh (3 meshd), meshctl bench --load $load (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    run_mesh "$load"
    echo "   meshctl bench exit $mesh_rc"
    e=$tmp/etcd-$load/perf.out
    m=$tmp/mesh-$load/bench.out
    er=$(etcd_rate "$e" || echo 0)
    es=$(etcd_slowest "$e" || echo 0)
    ed=$(etcd_stddev "$e" || echo 0)
    mr=$(mesh_field "$m" 'writes/s' || echo 0)
    ms=$(awk -v v="$(mesh_field "$m" slowest || echo 0)" 'BEGIN { printf "%.6f", v / 1000 }')
    md=$(awk -v v="$(mesh_field "$m" stddev || echo 0)" 'BEGIN { printf "%.6f", v / 1000 }')
    summary+=$(printf '\n%-4s %10s %10s %8s   %10s %10s %8s   %10s %10s %8s' \
        "$load" "$er" "$mr" "$(ratio "$mr" "$er")" "$es" "$ms" "$(ratio "$ms" "$es")" \
        "$ed" "$md" "$(ratio "$md" "$ed")")
    esc=$(cat "$tmp/etcd-$load/servers.cpu" 2>/dev/null || echo 0)
    ecc=$(cat "$e.cpu" 2>/dev/null || echo 0)
    msc=$(cat "$tmp/mesh-$load/servers.cpu" 2>/dev/null || echo 0)
    mcc=$(cat "$m.cpu" 2>/dev/null || echo 0)
    cpu_summary+=$(printf '\n%-4s %10s %10s %8s   %10s %10s %8s' "$load" \
        "$(per_write "$esc" "$er")" "$(per_write "$msc" "$mr")" \
        "$(ratio "$(per_write "$msc" "$mr")" "$(per_write "$esc" "$er")")" \
        "$(per_write "$ecc" "$er")" "$(per_write "$mcc" "$mr")" \
        "$(ratio "$(per_write "$mcc" "$mr")" "$(per_write "$ecc" "$er")")")
done
echo
echo "== side by side (ratio = mesh / etcd; writes/s higher is better, slowest and stddev lower)"
printf '%-4s %10s %10s %8s   %10s %10s %8s   %10s %10s %8s' load 'etcd w/s' 'mesh w/s' ratio \
    'etcd slow' 'mesh slow' ratio 'etcd sd' 'mesh sd' ratio
echo "$summary"
echo
echo "== CPU per write in µs (user + system; servers: the 3 members or replicas while the client ran; client: etcdctl or meshctl bench)"
printf '%-4s %10s %10s %8s   %10s %10s %8s' load 'etcd srv' 'mesh srv' ratio 'etcdctl' 'meshctl' ratio
echo "$cpu_summary"
