#!/bin/bash
# A throw-away one-host Slurm cluster for the tests: munged, slurmctld and slurmd (Debian's
# packages, run as root) with every file under one directory.
#
#   slurm_cluster.sh start DIR [OWNER_PID]
#       writes a key and a config into DIR, starts the daemons, waits until the node is idle,
#       writes DIR/env (SLURM_CONF=DIR/slurm.conf: source it, or pass SLURM_CONF to
#       srun/sbatch/squeue/scancel). With OWNER_PID, a watchdog stops the cluster once that
#       process is gone: a test killed by its time limit (SIGKILL, no clean-up of its own) leaves
#       no daemons behind.
#   slurm_cluster.sh stop DIR
#       cancels the cluster's jobs, stops the daemons and whatever process still belongs to the
#       cluster; idempotent, never fails (nothing to do when DIR is gone).
#
# The node has a fake GRES of 4 GPUs (device files linked to /dev/null), so that job scripts for
# GPU nodes (--gpus-per-node=4) are accepted as they are; the tasks simply see no GPU.
set -euo pipefail

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}
if [ $# -lt 2 ] || [ $# -gt 3 ]; then usage; fi
action="$1"
dir="$2"
owner="${3:-}"
case "$action" in start | stop | watch) ;; *) usage ;; esac
if [ "$action" != start ] && [ ! -d "$dir" ]; then exit 0; fi
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"  # absolute: the daemons chdir, and the pid files are matched by path
conf="$dir/slurm.conf"
host=localhost
# Only Slurm's own programs get SLURM_CONF (through `sl` or env): it is what marks the cluster's
# processes for stop's sweep, so none of this script's helpers (tr, grep) may carry it.
unset SLURM_CONF
sl() { SLURM_CONF="$conf" "$@"; }

log() { echo "slurm_cluster: $*" >&2; }

# The pids of every process that belongs to this cluster but the daemons: job steps (slurmstepd
# and the tasks, whose environment holds SLURM_CONF=$conf: the daemons and srun pass it on), and
# srun/sbatch clients. This script and its callers are left alone, even when they carry the
# variable themselves.
cluster_pids() {
  local ancestors=" " p=$$ pid
  while [ -n "$p" ] && [ "$p" != 0 ]; do
    ancestors+="$p "
    p="$(awk '{print $4}' "/proc/$p/stat" 2>/dev/null || true)"
  done
  for pid in /proc/[0-9]*; do
    pid="${pid#/proc/}"
    case "$ancestors" in *" $pid "*) continue ;; esac
    [ "$pid" = "$BASHPID" ] && continue
    # tr: environ is NUL-separated; a process that vanished meanwhile just matches nothing.
    if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "SLURM_CONF=$conf"; then
      echo "$pid"
    fi
  done
}

# TERM to `pids`, then KILL to those still there after `grace` seconds.
term_then_kill() {
  local grace="$1" pid i alive
  shift
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < grace * 10; i++)); do
    alive=0
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null; then
        alive=1
      fi
    done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

# The pid in `file` when that process still runs and is ours (its command line names DIR: a
# pid file that a killed run left behind may name a pid since reused by another program).
pid_from() {
  local pid
  pid="$(cat "$1" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -e "$dir/" -e "$dir "; then
    echo "$pid"
  fi
}

stop() {
  local jobs pids i
  # Jobs first, while slurmctld and slurmd are there to end them the Slurm way (KillWait).
  if [ -n "$(pid_from "$dir/slurmctld.pid")" ]; then
    jobs="$(timeout 10 env SLURM_CONF="$conf" squeue -h -o %A 2>/dev/null || true)"
    if [ -n "$jobs" ]; then
      # shellcheck disable=SC2086
      timeout 10 env SLURM_CONF="$conf" scancel $jobs 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do
        [ -z "$(timeout 5 env SLURM_CONF="$conf" squeue -h -o %A 2>/dev/null || true)" ] && break
        sleep 0.1
      done
    fi
  fi
  # slurmd before slurmctld (which would otherwise mark it down and log about it), munged last:
  # both Slurm daemons authenticate through it until they exit.
  pids=""
  for name in watchdog slurmd slurmctld munged; do
    pids="$(pid_from "$dir/$name.pid")"
    # shellcheck disable=SC2086
    [ -z "$pids" ] || term_then_kill 5 $pids
  done
  # What outlives the daemons: steps of jobs that did not end in time (slurmstepd is not a child
  # of slurmd), their tasks, srun clients.
  # shellcheck disable=SC2046
  term_then_kill 3 $(cluster_pids)
  rm -f "$dir"/{watchdog,slurmd,slurmctld,munged}.pid
  return 0
}

# A TCP port nothing listens on (on any address: slurmd and slurmctld bind to all), from a range
# above the rendezvous ports that jobs derive from their ids (below 20000, see FirstJobId) and
# below the ephemeral ports (32768 up).
free_port() {
  local port i
  for ((i = 0; i < 200; i++)); do
    port=$((20000 + RANDOM % 10000))
    # A connection refused means no listener; `timeout` for hosts that drop instead.
    if ! timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
      case " ${taken:-} " in *" $port "*) continue ;; esac
      taken="${taken:-} $port"
      echo "$port"
      return 0
    fi
  done
  log "no free port found"
  return 1
}

write_config() {
  local ctld_port d_port cpus
  cpus="$(nproc)"
  ctld_port="$(free_port)"
  d_port="$(free_port)"
  mkdir -p "$dir/state" "$dir/spool"
  # The node is "localhost" (slurmd -N), whatever the machine's name: that name may not resolve
  # (a chroot without the host's /etc/hosts), while the jobs' tasks resolve the node names of
  # SLURM_STEP_NODELIST to meet. Its real core count (slurmd refuses a node that claims more
  # than it has); one partition. Job ids start at a random point: the rendezvous port a job
  # derives from its id (15000 + its last 4 digits) then differs from run to run, so that one
  # run's sockets in TIME_WAIT never meet the next's; below 5000, so that port stays under
  # Slurm's own (20000 up).
  cat >"$conf" <<EOF
ClusterName=ddptest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups (none to delegate here): processes are tracked by parentage, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
FirstJobId=$((1000 + RANDOM % 3000))
# scancel's TERM, then KILL after this many seconds: ddp_train stops on TERM long before.
KillWait=10
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  # The fake GPUs: gres/gpu drops a GPU without a device file (File=; Slurm 22.05 and 24.11),
  # and 24.11 wants a character or block device there; nothing opens them, so four links to
  # /dev/null stand in for /dev/nvidia0..3.
  mkdir -p "$dir/dev"
  for i in 0 1 2 3; do ln -sfn /dev/null "$dir/dev/gpu$i"; done
  cat >"$dir/gres.conf" <<EOF
NodeName=$host Name=gpu File=$dir/dev/gpu[0-3]
EOF
}

start_munge() {
  local i
  # munged refuses a key or a socket dir that others can read.
  mkdir -p "$dir/munge"
  chmod 700 "$dir/munge"
  if [ ! -s "$dir/munge/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom >"$dir/munge/munge.key")
  fi
  chmod 400 "$dir/munge/munge.key"
  # --force: the socket of a former run may still be there.
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
    --seed-file="$dir/munge/munged.seed" --force
  for ((i = 0; i < 50; i++)); do
    [ -S "$dir/munge/munge.sock" ] && return 0
    sleep 0.1
  done
  log "munged made no socket"
  return 1
}

# Whether sinfo shows the node idle.
node_idle() {
  [ "$(timeout 5 env SLURM_CONF="$conf" sinfo -h -N -o %t 2>/dev/null | head -1)" = idle ]
}

start() {
  local deadline
  # Whatever a killed former run left in DIR: its daemons, its jobs, its state.
  if [ -f "$conf" ]; then stop; fi
  rm -rf "$dir/state" "$dir/spool" "$dir"/*.log "$dir/env"
  write_config
  start_munge
  # Both daemons fork into the background once they are up; -f: not /etc/slurm/slurm.conf.
  # SLURM_CONF in their environment marks their children (slurmstepd) for stop's sweep.
  sl slurmctld -f "$conf"
  sl slurmd -f "$conf" -N "$host"
  deadline=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    if node_idle; then
      echo "SLURM_CONF=$conf" >"$dir/env"
      log "up: $(timeout 5 env SLURM_CONF="$conf" sinfo -h -N -o '%N %t %C'), SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.1
  done
  log "the node is not idle after 30 s:" \
    "$(timeout 5 env SLURM_CONF="$conf" sinfo -h -N -o '%N %t %E' 2>&1 || true)"
  for f in munged slurmctld slurmd; do
    echo "---- $dir/$f.log" >&2
    tail -n 40 "$dir/$f.log" >&2 2>/dev/null || true
  done
  stop
  return 1
}

# The watchdog: polls the owner; once it is gone, stops the cluster (its pid file first removed,
# so that stop does not end the watchdog itself).
watch() {
  echo $$ >"$dir/watchdog.pid"  # its own pid, should setsid have forked
  while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  rm -f "$dir/watchdog.pid"
  stop
}

case "$action" in
  start)
    # A failure part way (a daemon that refuses its config) stops what already started.
    stop_on_failure() {
      local status=$?
      [ "$status" = 0 ] || stop
      exit "$status"
    }
    trap stop_on_failure EXIT
    start
    if [ -n "$owner" ]; then
      # Its own session, output nowhere: the caller's pipes close when start returns.
      setsid "$0" watch "$dir" "$owner" </dev/null >/dev/null 2>&1 &
      echo $! >"$dir/watchdog.pid"
    fi
    ;;
  stop) stop ;;
  watch) watch ;;
esac
