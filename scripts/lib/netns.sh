# Sourced by ci-slurm.sh and (through netns-docker-host.sh) ci-remote-host.sh and ci-ec2-host.sh:
# the shared steps of a test host in a network namespace. Every step is idempotent: run on a setup
# that is up, it changes nothing. The caller sets NAME (for messages).

# A pid file names its daemon only while that daemon lives:
# - a killed daemon whose parent has not reaped it yet is a zombie: kill -0 still answers, so its
#   state is read too (the fault bench kills daemons and `up` must start them again);
# - a daemon killed -9 leaves its pid file, and the pid is given to another process once the pids
#   wrap (pid_max is 32768 on the CI machines, and a suite run goes through it): that process
#   started after the file was written, so it is not ours (a CI run found gw0's ssh:// host
#   "alive" with no engine answering, and every later test of that worker failed its setup).
_HZ=$(getconf CLK_TCK)
alive() {
    local pid line fields written up now
    pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] || return 1
    line=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    read -r -a fields <<<"${line##*) }"   # after the command name: state is [0], start time [19]
    [ "${fields[0]}" != Z ] || return 1
    # In hundredths of a second (not /proc/stat's btime, whole seconds: with the file's time also
    # cut to seconds a process started 3.5 s after the file passed as the daemon, CI stop 51).
    written=$(stat -c %.2Y "$1" 2>/dev/null) || return 1
    read -r up _ </proc/uptime || return 1
    now=${EPOCHREALTIME//[!0-9]/}   # microseconds
    # the boot's time (now less the time since), plus the process's start after it
    [ $((now / 10000 - 10#${up//[!0-9]/} + fields[19] * 100 / _HZ)) -le $((10#${written//[!0-9]/} + 200)) ]
}

install_config() {  # install_config FILE PIDFILE: FILE.new replaces FILE if it differs, and a running daemon rereads it
    if cmp -s "$1.new" "$1"; then rm -f "$1.new"; return 0; fi
    mv "$1.new" "$1"
    alive "$2" || return 0
    kill -HUP "$(cat "$2")"   # sshd re-executes itself, and writes its pid file again
    for _ in $(seq 50); do sleep 0.1; alive "$2" && return 0; done
}

wait_for() {  # wait_for WHAT LOG COMMAND...: retry COMMAND for 30 s (WAIT_FOR_S: another bound)
    local what=$1 logfile=$2 until=$((SECONDS + ${WAIT_FOR_S:-30})); shift 2
    while :; do
        "$@" >/dev/null 2>&1 && return
        [ "$SECONDS" -lt "$until" ] || break
        sleep 0.2
    done
    tail -n 20 "$logfile" >&2 || true
    echo "$NAME: $what did not come up (log: $logfile)" >&2
    return 1
}

stop_pidfile() {  # SIGTERM the daemon of a pid file, wait up to 30 s, then SIGKILL
    alive "$1" || { rm -f "$1"; return 0; }
    local pid
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || { rm -f "$1"; return 0; }; sleep 0.2; done
    echo "$NAME: pid $pid ($1) did not exit in 30 s: killed" >&2
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
}

# netns_link_up NS HOST_IF NS_IF NS_IP/PREFIX (HOST_IP/PREFIX | bridge:BRIDGE)
#   namespace NS with a veth pair: NS_IF inside (with NS_IP, and lo up), HOST_IF on this side,
#   with HOST_IP or enslaved to BRIDGE. Made only when HOST_IF is missing.
netns_link_up() {
    local ns=$1 host_if=$2 ns_if=$3 ns_ip=$4 this_side=$5
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    ip link show "$host_if" >/dev/null 2>&1 && return
    ip link add "$host_if" type veth peer name "$ns_if" netns "$ns"
    case "$this_side" in
        bridge:*) ip link set "$host_if" master "${this_side#bridge:}" ;;
        *) ip addr add "$this_side" dev "$host_if" ;;
    esac
    ip link set "$host_if" up
    ip -n "$ns" addr add "$ns_ip" dev "$ns_if"
    ip -n "$ns" link set "$ns_if" up
    ip -n "$ns" link set lo up
}

netns_link_down() {  # netns_link_down NS HOST_IF: deleting one end of a veth pair deletes the other
    ! ip link show "$2" >/dev/null 2>&1 || ip link del "$2"
    [ ! -e "/run/netns/$1" ] || ip netns del "$1"
}
