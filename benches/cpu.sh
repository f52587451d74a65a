# benches/cpu.sh: sourced by the bench scripts that report the servers' CPU per write.

# cpu_ms PID...: CPU time (user + system) the processes used so far, in milliseconds. Fields 14 and
# 15 of /proc/PID/stat, counted after the ")" that ends the command name (which may hold spaces).
cpu_ms() {
    local t=0 p
    for p in "$@"; do
        [ -r "/proc/$p/stat" ] && t=$((t + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
    done
    echo $((t * 1000 / $(getconf CLK_TCK)))
}
