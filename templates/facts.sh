#!/bin/bash
# shellcheck disable=SC2317 # a library: which functions a node's script calls depends on what it asks
# The facts' sections, one function each, and what runs them: sparkctl/facts/sections.py says which sections a node
# runs (and with what arguments) and reads what each prints; sparkctl/facts/script.py puts this file at the top of a
# node's facts script and calls them, each in its framed section. A missing command only makes its section empty.
# `_S` is what runs a command as root (empty as root already, and in the privileged shell), `_SUDO_OK` 1 when that
# works.

# Run a command under `timeout` when the node has it, so that a hung daemon (docker) cannot eat the round trip.
_t() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
# The same, as what a command substitution runs: it becomes the command (`exec`), where bash would fork once more for
# a function's command. Bash runs a lone command of a substitution in place of its subshell, but one with a
# redirection of its own in a child of it: the captures below keep their redirections outside (`{ v=$(cmd); }
# 2>/dev/null`). Each of those forks was a process on every read of the facts.
_tx() { if command -v timeout >/dev/null 2>&1; then exec timeout "$@"; else shift; exec "$@"; fi; }
_has() { command -v "$1" >/dev/null 2>&1; }
# _print FILE: a text file as it is, read by the shell itself (sparkctl/facts/script.py defines it: the tasks'
# reads' text_of)

# bash's $HOSTNAME is gethostname(2), what `hostname` prints
fact_hostname() { if [ -n "${HOSTNAME:-}" ]; then printf '%s\n' "$HOSTNAME"; else _print /proc/sys/kernel/hostname; fi; }
fact_os_release() { _print /etc/os-release || _print /usr/lib/os-release; }
fact_dgx_release() { _print /etc/dgx-release; }
# the kernel's machine name, as `uname -m` prints it: kernel.arch (Linux 6.1+, Documentation/admin-guide/sysctl/
# kernel.rst "arch"), read by the shell; `uname -m` on older kernels
fact_arch() { local a=; read -r a 2>/dev/null </proc/sys/kernel/arch; if [ -n "$a" ]; then printf '%s\n' "$a"; else uname -m; fi; }
# `id`'s one line: the user's name and groups, by name (parsed as `id -un` and `id -Gn` print them)
fact_id() { id; printf '%s\n' "${EUID:-$(id -u)}"; }
fact_home() { printf '%s\n' "$HOME"; }
fact_ip_addr() { ip -j -d addr show; }
fact_ssh_connection() { printf '%s\n' "${SSH_CONNECTION:-}"; }
fact_routes() { ip -4 -o route show table main 2>/dev/null; }
fact_docker_cli() { command -v docker; }
fact_meminfo() { _print /proc/meminfo; }
# bash 5's $EPOCHREALTIME (its decimal point is the locale's: the script runs with LC_ALL=C)
fact_time() { if [ -n "${EPOCHREALTIME:-}" ]; then printf '%s\n' "$EPOCHREALTIME"; else date +%s.%N; fi; }

# `read` instead of `$(cat ...)`: no fork per interface (forks are most of this script's cost)
fact_carrier() {
  for f in /sys/class/net/*/carrier; do
    [ -e "$f" ] || continue; n=${f%/carrier}; n=${n##*/}; c=
    read -r c < "$f" 2>/dev/null
    printf '%s %s\n' "$n" "$c"
  done
}

# The RoCE devices and their netdevs, as ibdev2netdev prints them (Mellanox/mlnx-tools ofed_scripts/ibdev2netdev):
# `DEV port PORT ==> NETDEV (Up|Down)`, read from sysfs as that script reads it (the netdev the kernel gives the
# port's GID table, else the PCI function's; Up when its carrier reads 1) by the shell itself: the script is bash
# that starts a few dozen `cat`, `ls` and `grep` on a Spark. ibdev2netdev answers where sysfs has no RoCE port to
# read (no /sys/class/infiniband, or an InfiniBand port: the script matches those by GID).
fact_roce() {
  local d p n l c s ib='' lines=()
  for d in /sys/class/infiniband/*; do
    for p in "$d"/ports/*; do
      [ -e "$p" ] || continue
      l=; read -r l 2>/dev/null <"$p/link_layer"
      [ "$l" = InfiniBand ] && ib=1
      n=; read -r n 2>/dev/null <"$p/gid_attrs/ndevs/0"
      if [ -z "$n" ]; then for l in "$d"/device/net/*; do [ -e "$l" ] && { n=${l##*/}; break; }; done; fi
      [ -n "$n" ] || continue
      s=NA
      if [ -e "/sys/class/net/$n/carrier" ]; then
        c=; read -r c 2>/dev/null <"/sys/class/net/$n/carrier"; s=Down; [ "$c" = 1 ] && s=Up
      fi
      lines+=("${d##*/} port ${p##*/} ==> $n ($s)")
    done
  done
  if { [ -n "$ib" ] || [ "${#lines[@]}" -eq 0 ]; } && _has ibdev2netdev; then ibdev2netdev
  elif [ "${#lines[@]}" -gt 0 ]; then printf '%s\n' "${lines[@]}"; fi
}

# lldpcli is setuid _lldpd, mode 4750 _lldpd:adm on Debian/Ubuntu (and /usr/sbin is not in a user's PATH over ssh):
# found by path, asked as root when that works. Only read: sparkctl never starts lldpd itself.
fact_lldp() {
  # found on PATH by `hash` (BASH_CMDS): a `$(command -v ...)` is a process
  _L=; hash lldpcli 2>/dev/null && _L=${BASH_CMDS[lldpcli]}
  for p in /usr/sbin/lldpcli /usr/local/sbin/lldpcli; do [ -z "$_L" ] && [ -e "$p" ] && _L=$p; done
  if [ -z "$_L" ]; then echo '#absent'; else _t 10 "${_S[@]}" "$_L" show neighbors -f json 2>&1; fi
}

# Each netdev's speed (Mb/s) from sysfs, read by the shell; ethtool asked only for a RoCE netdev with carrier whose
# sysfs speed could not be read (the same driver call answers both: a link down has none in either)
fact_speed() {
  local f n v c sp l
  for f in /sys/class/net/*/speed; do
    [ -e "$f" ] || continue; n=${f%/speed}; n=${n##*/}; v=
    read -r v < "$f" 2>/dev/null
    printf 'sysfs %s %s\n' "$n" "$v"
  done
  _has ethtool || return 0
  for n in /sys/class/infiniband/*/device/net/*; do
    [ -e "$n" ] || continue; n=${n##*/}; v=; c=
    read -r v 2>/dev/null <"/sys/class/net/$n/speed"; read -r c 2>/dev/null <"/sys/class/net/$n/carrier"
    if [ "$c" != 1 ] || [[ $v =~ ^[1-9][0-9]*$ ]]; then continue; fi
    { sp=$(exec ethtool "$n"); } 2>/dev/null
    while IFS= read -r l; do
      [[ $l =~ ^[[:space:]]*Speed:[[:space:]]*(.*)$ ]] && printf 'ethtool %s %s\n' "$n" "${BASH_REMATCH[1]}"
    done <<<"$sp"
  done
  true
}

# sparkctl's own sysctl.d files (a relaying ring node's forwarding): name and base64 content
fact_sparkctl_sysctl() {
  for f in /etc/sysctl.d/*-sparkctl-*.conf; do
    [ -f "$f" ] || continue; printf '%s ' "$f"; base64 < "$f" | tr -d '\n'; echo
  done
}

# forwarding and reverse-path filtering: a ring relays between neighbours
fact_ipv4_conf() {
  for f in /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/*/forwarding /proc/sys/net/ipv4/conf/*/rp_filter; do
    [ -e "$f" ] || continue; v=; read -r v < "$f" 2>/dev/null; printf '%s %s\n' "${f#/proc/sys/net/ipv4/}" "$v"
  done
}

# netplan's files are 0600 root: read as root when that works; each as its mode, `text` and its path, then its lines
# (_lines_of), or as its mode, `b64:` and its base64, and its path: the content kept exactly either way
fact_netplan() {
  local f m s files=()
  local -A modes=() sizes=()
  for f in /etc/netplan/*.yaml; do [ -e "$f" ] && files+=("$f"); done
  [ "${#files[@]}" -gt 0 ] || return 0
  # every file's mode and size in one stat
  while read -r m s f; do modes[$f]=$m; sizes[$f]=$s; done < <(stat -c '%a %s %n' "${files[@]}" 2>/dev/null)
  for f in "${files[@]}"; do
    m=${modes[$f]:--}
    if [ -r "$f" ] && _lines_of "$f" "${sizes[$f]:-}"; then
      printf '%s text %s\n' "$m" "$f"; [ "${#_NL[@]}" -eq 0 ] || printf '%s\n' "${_NL[@]}"
    # a file the shell cannot print as lines (a NUL in it) by its base64, straight out
    elif [ -r "$f" ]; then printf '%s b64:' "$m"; base64 -w0 <"$f"; printf ' %s\n' "$f"
    elif [ "$_SUDO_OK" = 1 ]; then printf '%s b64:' "$m"; "${_S[@]}" base64 -w0 "$f" 2>/dev/null; printf ' %s\n' "$f"
    else printf '%s - %s\n' "$m" "$f"; fi
  done
}

# _lines_of FILE SIZE: FILE's lines into _NL, each after `|` (`~` before a last line without its newline), read by the
# shell (a `base64` was a process per file); fails where they are not all of it: a NUL, which `read` drops, makes
# their bytes (LC_ALL=C: ${#l} counts bytes) fewer than SIZE
_lines_of() {
  local l n=0
  _NL=()
  while IFS= read -r l; do _NL+=("|$l"); n=$((n + ${#l} + 1)); done 2>/dev/null <"$1"
  [ -z "$l" ] || { _NL+=("~$l"); n=$((n + ${#l})); }
  [ "$n" = "$2" ]
}

# NetworkManager's view, when nmcli exists (DGX OS renders netplan through it): C locale for the words it prints;
# readable by any user over D-Bus; the settings are not asked once it says it is not running. Three calls (each costs
# ~50 ms of the round trip and ~25 ms of the node's CPU, NetworkManager's and dbus's share included), under ONE
# `timeout` in a bash of their own, which takes the job's place (_job_exec); each under its own where the facts run
# in order (no temp dir). Parsed in sparkctl/facts/networkmanager.py.
fact_nm() {
  if ! _has nmcli; then echo '#absent'; return; fi
  if [ -n "$_TO" ] && [ -n "$_D" ] && declare -f _nm_asks >"$_D/.nm" 2>/dev/null && echo '_nm_asks' >>"$_D/.nm"; then
    _job_exec timeout 10 bash "$_D/.nm"
  elif [ -n "$_TO" ]; then _nm_asks timeout 5
  else _nm_asks; fi
}

# _nm_asks [BOUND...]: nmcli's three answers, each run by the command BOUND (`timeout 5` where each has its own).
# The devices are asked beside the connections: each nmcli mostly waits for NetworkManager's answer over D-Bus, and
# the devices' ask was the nm section's first third of its time. Their answer, read back from its pipe, ends with
# its exit status.
_nm_asks() {
  local -x LC_ALL=C
  local c d f l r u=()
  exec {f}< <("$@" nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device status 2>&1; echo "#rc $?")
  c=$(exec "$@" nmcli -t -f UUID,NAME,TYPE,DEVICE,ACTIVE,AUTOCONNECT,AUTOCONNECT-PRIORITY,FILENAME connection show 2>&1)
  IFS= read -r -d '' -u "$f" d; exec {f}<&-
  echo '#devices'; printf '%s' "${d%'#rc '*}"
  [ "${d##*'#rc '}" = $'0\n' ] || return 0
  echo '#connections'
  printf '%s\n' "$c"
  echo '#settings'
  # each line's UUID, walked in the string itself (a here-string is a pipe, read a byte per system call)
  r=$c
  while [ -n "$r" ]; do
    l=${r%%$'\n'*}; r=${r:${#l}+1}
    [[ $l =~ ^([0-9a-fA-F-]{36}): ]] && u+=("${BASH_REMATCH[1]}")
  done
  if [ "${#u[@]}" -gt 0 ]; then
    "$@" nmcli -t -f connection.uuid,connection.interface-name,802-3-ethernet.mac-address connection show "${u[@]}" 2>&1
  fi
}

# with nothing to inspect, `docker ps` tells whether this user can talk to the daemon (Docker and Podman)
fact_docker_info() { _has docker && { _t 15 docker ps -q >/dev/null; } 2>&1; }

# Everything docker knows that sparkctl asks, in one ask. Arguments: how many Engine API paths follow, the paths
# (the cluster's labelled containers, each container, each image), then the same containers and images for the
# CLI. Docker's Engine API over its socket answers them all in one curl; the `docker` CLI, one `docker inspect`,
# where the API cannot be the CLI's own daemon or did not answer each one plainly (fact_docker_api).
fact_docker() {
  local n=$1 r; shift
  fact_docker_api "${@:1:n}"; r=$?
  # answered, or too slow: the CLI would ask the same daemon (124: what `timeout` says, read as docker being slow)
  [ "$r" = 0 ] || [ "$r" = 124 ] && return "$r"
  shift "$n"
  fact_docker_inspect "$@"
}

# The Engine API on docker's default socket, one curl (no `docker` client start per ask, no `timeout`): only where
# the CLI talks to that same daemon (no DOCKER_HOST, no context chosen in its environment or config) and this user
# may use the socket (the docker group). Prints `#api`, then each answer's body and its `#http CODE` line. Any
# other answer than 200, or a 404 that does not say "no such" container or image (docker's words for an unknown
# route are "page not found"), or curl failing, prints nothing and leaves it to the CLI; a daemon that does not
# answer within 15 s returns 124 (`--fail-early`: the first transfer cut ends the others).
fact_docker_api() {
  local s=/var/run/docker.sock c=${DOCKER_CONFIG:-$HOME/.docker}/config.json l out r
  [ "$#" -gt 0 ] && [ -z "${DOCKER_HOST:-}${DOCKER_CONTEXT:-}" ] && [ -S "$s" ] && [ -r "$s" ] && [ -w "$s" ] &&
    _has curl || return 1
  if [ -r "$c" ]; then
    while IFS= read -r l || [ -n "$l" ]; do
      [[ $l =~ \"currentContext\"[[:space:]]*:[[:space:]]*\"([^\"]*)\" ]] && [ "${BASH_REMATCH[1]}" != default ] &&
        return 1
    done <"$c"
  fi
  local ask=(curl -sS --fail-early --max-time 15 --unix-socket "$s" -w '\n#http %{http_code}\n' \
    "${@/#/http://localhost}")
  if [ -n "${_RAW:-}" ]; then
    # the job's curl answered into its section (_held): what it printed after the mark, and its exit status
    out=; IFS= read -r -d '' out <"$_RAW"; out=${out#\#raw$'\n'}; r=$_RAWRC
    while [[ $out == *$'\n' ]]; do out=${out%$'\n'}; done
  elif [ -n "${_JOB:-}" ]; then
    # in a job, curl takes its place, printing into the section: _held judges its answer once the job is done
    printf '#raw\n'
    exec "${ask[@]}" 2>/dev/null
  else
    { out=$(exec "${ask[@]}"); } 2>/dev/null; r=$?
  fi
  [ "$r" = 28 ] && return 124
  [ "$r" = 0 ] || return 1
  # judged from the file where there is one: a here-string is a pipe, which `read` takes a byte per system call
  if [ -n "${_RAW:-}" ]; then _api_plain <"$_RAW" || return 1; else _api_plain <<<"$out" || return 1; fi
  printf '#api\n%s\n' "$out"
}

# _api_plain: every answer on stdin a 200, or a 404 that says "no such" container or image (after its body's line)
_api_plain() {
  local l p=''
  while IFS= read -r l; do
    case $l in
      '#http 200') ;;
      '#http 404') [[ ${p,,} == *'no such '* ]] || return 1 ;;
      '#http '*) return 1 ;;
      ?*) p=$l ;;
    esac
  done
}

# ONE `docker inspect` of the containers and images asked: each docker call costs a client start, a daemon round
# trip and, with podman, its storage locks. Its stderr is kept, each line marked `#err `: "no such object" is an
# answer, a refused socket or a broken storage is not.
fact_docker_inspect() {
  _has docker || return 1
  local _e=${_D:+$_D/.docker-err} _l _r
  [ -n "$_e" ] || _e=$(mktemp 2>/dev/null || echo "/tmp/.sfi.$$")
  _t 15 docker inspect "$@" 2>"$_e"; _r=$?
  while IFS= read -r _l || [ -n "$_l" ]; do printf '#err %s\n' "$_l"; done <"$_e"
  [ -n "$_D" ] || rm -f "$_e"
  return "$_r"
}

# the Hugging Face cache (argument, its `~` expanded by the call): where it is, the space free there (df needs an
# existing path: the nearest existing parent), and the model pins sparkctl keeps in it
fact_hf_cache() {
  local p=$1 d f l
  printf '%s\n' "$p"
  d=$p; while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do
    case $d in */*) d=${d%/*}; d=${d:-/} ;; *) d=. ;; esac
  done
  # its header line, then the number (the read takes the last number before the pins)
  df -B1 --output=avail "$d" 2>/dev/null
  for f in "$p"/sparkctl-pins/models--*; do
    [ -f "$f" ] || continue; l=; IFS= read -r l <"$f"; printf 'pin\t%s\t%s\n' "${f##*/}" "$l"
  done; true
}

fact_ss() { if [ "$_SUDO_OK" = 1 ]; then "${_S[@]}" ss -ltnpH 2>/dev/null || ss -ltnH; else ss -ltnpH; fi; }

# root already, or `sudo -n` ran the privileged shell: sudo asked once, by that shell
fact_sudo() { [ "$_SUDO_OK" = 1 ]; }

# sparkctl's firewall files (arguments: the unit's name, the link `systemctl enable` makes for it, then the rules, the
# listing, the unit; 644, no secret in them), each after its marker, absent ones left out, then whether the unit is
# enabled: as `systemctl is-enabled` says it where the link leads to the unit's file (the last argument) and nothing
# in /run/systemd/system stands in for it (a runtime mask, a runtime unit); asked where that is not so
fact_firewall_files() {
  local _unit=$1 _wants=$2 _file=${!#} _f
  shift 2
  for _f in "$@"; do [ -f "$_f" ] && { echo "#file $_f"; _print "$_f"; }; done
  echo '#enabled'
  if [ -L "$_wants" ] && [ -f "$_file" ] && [ ! -L "$_file" ] && [ "$_wants" -ef "$_file" ] &&
    [ ! -e "/run/systemd/system/$_unit" ] && [ ! -L "/run/systemd/system/$_unit" ]; then echo enabled
  else systemctl is-enabled "$_unit" 2>/dev/null; fi
  true
}

fact_firewall() {
  if _has ufw; then echo '#ufw'; "${_S[@]}" ufw status 2>&1; fi
  if _has nft; then echo '#nft'; "${_S[@]}" nft list ruleset 2>&1; fi
  if _has iptables; then echo '#iptables'; "${_S[@]}" iptables -S INPUT 2>&1; fi
}

# _held NAME [CALL...]: a background or privileged section's output, and its exit status in _rc (a background one's by
# `wait`; a privileged one's from the root shell, empty: it was cut short), once the facts' own background jobs are
# done (not the side reads; the root shell's root reads, bounded, among them). CALL: the background section's own.
_held() {
  local n=$1 l=
  shift
  _jobs_done
  if [ -z "${_FN[$n]:-}" ]; then _print "$_D/$n"; _rc=1; read -r _rc <"$_D/$n.rc"; return; fi
  wait "${_FN[$n]}"; _rc=$?
  # a job whose command took its place printed that command's raw answer after `#raw`: the section's CALL, run
  # again here, judges it (fact_docker_api)
  { IFS= read -r l <"$_D/$n"; } 2>/dev/null
  if [ "$l" = '#raw' ] && [ "$#" -gt 0 ]; then _RAW=$_D/$n _RAWRC=$_rc "$@"; _rc=$?; else _print "$_D/$n"; fi
}

# _jobs_done: the facts' background jobs ended; where sudo refused the root shell (it never began), the privileged
# sections run as the user now, once
_jobs_done() {
  wait "${_FP[@]}"
  if [ -n "$_PJ" ] && [ ! -e "$_D/.privileged" ]; then
    ( _privileged "$_D" 0 ) </dev/null >/dev/null 2>&1 3>&-
  fi
  _PJ=
}

# _job_exec COMMAND...: a background section's last command, run in the job's place (`exec`: no process kept only to
# wait for it); run as any other where the section runs in this shell
_job_exec() { if [ -n "${_JOB:-}" ]; then exec "$@"; else "$@"; fi; }

# The script's start: its clock (bash's $SECONDS, whole seconds), its private temp dir (none: every section runs in
# order, and no side read runs), and how root is reached: root already, else `sudo -n`, which the privileged shell
# tries once when there is a temp dir, and which is asked here when there is none.
_facts_begin() {
  _T0=$SECONDS; _FP=(); _PJ=; declare -gA _FN=(); _SP=(); _SW=(); _SG=(); _SGR=(); _TO=""; _has timeout && _TO=timeout
  # the login's own runtime dir where it has one (logind's tmpfs, the user's alone): creating and removing the
  # facts' few dozen files there costs a fraction of what it does on /tmp's disk filesystem
  local r=${XDG_RUNTIME_DIR:-}
  _D=
  if [ -n "$r" ] && [ -d "$r" ] && [ -w "$r" ] && [ -O "$r" ]; then { _D=$(mktemp -d -p "$r"); } 2>/dev/null; fi
  [ -n "$_D" ] || { _D=$(mktemp -d); } 2>/dev/null || _D=""
  if [ "${EUID:-$(id -u 2>/dev/null)}" = 0 ]; then _S=(); _SUDO_OK=1
  elif [ -n "$_D" ]; then _S=(sudo -n); _SUDO_OK=""
  elif sudo -n true >/dev/null 2>&1; then _S=(sudo -n); _SUDO_OK=1
  else _S=(); _SUDO_OK=0; fi
}

# The privileged sections (the function _privileged the script defines; _PF names it and every function it calls,
# the only ones the root shell is given), in the background of ONE root shell writing into the temp dir: `sudo -n`
# once, not once per command (each sudo costs ~10 ms of the node's CPU and a line in its auth log). Refused (a
# password, or no rule for a shell), the same sections run as the user with `_SUDO_OK` 0.
_privileged_job() {
  if [ "${#_S[@]}" -gt 0 ]; then
    # the functions' text through a file: `$(declare -f ...)` would be a process
    local f=
    declare -f "${_PF[@]}" >"$_D/.functions" && IFS= read -r -d '' f <"$_D/.functions"
    [ -n "$f" ] || f=$(declare -f "${_PF[@]}")  # the file could not be written (a full /tmp)
    # sudo in the job's place; refused, it leaves no mark, and _jobs_done runs the sections as the user
    exec "${_S[@]}" bash -c "$f
_privileged \"\$@\"" _ "$_D" 1 2>/dev/null
  fi
  _privileged "$_D" "$_SUDO_OK"
}

# In the root shell: umask 022, so that the user reads what root wrote (sudo keeps a stricter umask of theirs: 027
# would leave every section unreadable); set -C: root never writes through a file or link already there (the dir is
# the user's); a dir root may not enter (root-squashed NFS) fails the shell before its mark, and the user's runs.
_privileged_begin() {
  _S=(); _SUDO_OK=$2; export LC_ALL=C; umask 022; cd "$1" || exit 1; set -C
  : >.privileged
}

# _sides SECONDS I SCRIPT [I SCRIPT...]: later tasks' read-only SCRIPTs, in the background beside the facts, each in
# a subshell of ONE bash (a process per read, not a `timeout` and a bash each), bounded by SECONDS together: `timeout`
# is the job itself (the reads' bash where the node has none), so that its PID is known: stopped, it stops every read
# of it (it leads its own process group and passes the signal on). Nothing of the round trip's stdin or stdout (nor
# fd 3, its held stdout) stays open in them: one left behind must not hold the channel. The group's own stdout is a
# pipe this shell reads (_SW[G]): its end of file says that the group ended, so that the wait for it needs no
# process of its own (_sides_wait). side-I: a read's output, side-I.rc: its exit status once done; _SP[G]: the
# group's PID, _SG[I]: the read's group.
_sides() {
  local to=() g=${#_SP[@]} w
  [ -n "$_TO" ] && to=(timeout "$1")
  shift
  exec {w}< <("${to[@]}" bash -c "$_SIDE_READS" _ "$_D" "$@" 2>/dev/null </dev/null 3>&-)
  _SP[g]=$!; _SW[g]=$w
  while [ "$#" -gt 1 ]; do _SG[$1]=$g; shift 2; done
}
# the group's bash: its reads started at once, each one's exit status written as soon as it ended (each `wait -n`,
# bash 4.3's, returns when one more read ends; those already ended are swept first), so that one still running when
# the group is stopped costs only itself. A read runs in a subshell with no arguments and nothing of this bash's own
# but its text (_sr_b).
# shellcheck disable=SC2016 # the text of a script of its own
_SIDE_READS='_sr_d=$1; shift; declare -A _sr_i=()
while [ "$#" -gt 1 ]; do
  _sr_b=$2; ( unset _sr_d _sr_i; set --; eval "$_sr_b" ) >"$_sr_d/side-$1" 2>/dev/null & _sr_i[$!]=$1; shift 2
done
_sr_ended() {
  local p
  for p in "${!_sr_i[@]}"; do
    kill -0 "$p" 2>/dev/null && continue
    wait "$p"; echo "$?" >"$_sr_d/side-${_sr_i[$p]}.rc"; unset "_sr_i[$p]"
  done
}
if (( BASH_VERSINFO[0] * 100 + BASH_VERSINFO[1] >= 403 )); then
  while _sr_ended; [ "${#_sr_i[@]}" -gt 0 ]; do wait -n 2>/dev/null; done
else
  for _sr_p in "${!_sr_i[@]}"; do wait "$_sr_p"; echo "$?" >"$_sr_d/side-${_sr_i[$_sr_p]}.rc"; done
fi'

# _sides_wait GRACE: once the facts are read, the side reads get GRACE seconds more, or as long again as the facts
# took (a node under load is as slow for both); a group still running then is stopped and what it had not finished
# left out: those tasks read for themselves. The wait ends the moment the last group does: bash's `read -t` on each
# group's pipe returns at its end of file (nothing but the group holds its other end), and the time it waited is
# taken from the grace (bash 5's $EPOCHREALTIME; whole seconds by $SECONDS before it).
_sides_wait() {
  local grace=$((SECONDS - _T0)) g left t0 t1 t r w cut=''
  [ "$grace" -lt "$1" ] && grace=$1
  left=${grace}000000
  for g in "${!_SP[@]}"; do
    while [ -z "$cut" ]; do
      [ "$left" -gt 0 ] || { cut=1; break; }
      t0=${EPOCHREALTIME:-$SECONDS.000000}
      printf -v t '%d.%06d' $((left / 1000000)) $((left % 1000000))
      read -r -t "$t" -u "${_SW[$g]}"; r=$?
      t1=${EPOCHREALTIME:-$SECONDS.000000}
      left=$((left - (10#${t1/./} - 10#${t0/./})))
      [ "$r" -gt 128 ] && cut=1
      [ "$r" = 0 ] || break  # its end of file: the group ended
    done
  done
  [ -z "$cut" ] || kill "${_SP[@]}" 2>/dev/null
  for g in "${!_SP[@]}"; do wait "${_SP[$g]}"; _SGR[g]=$?; w=${_SW[$g]}; exec {w}<&-; done
}

# _side_out I: a side read's output, and its exit status in _rc: its own once it ended; 124 (and what it printed)
# when its group's SECONDS ran out first; 1 and nothing when it did not run, or was stopped
_side_out() {
  _rc=1
  local g=${_SG[$1]:-}
  [ -n "$g" ] && [ -n "${_SGR[$g]:-}" ] || return 0
  if [ -e "$_D/side-$1.rc" ]; then _print "$_D/side-$1"; read -r _rc <"$_D/side-$1.rc"
  elif [ "${_SGR[$g]}" = 124 ]; then _print "$_D/side-$1"; _rc=124; fi
}

# _root_side_out I: a root read's output (run in the root shell, sparkctl/facts/script.py), and its exit status in
# _rc: its own once the root shell ran it; 1 and nothing when it did not run (no passwordless sudo, no temp dir)
_root_side_out() {
  _rc=1
  [ -n "$_D" ] && [ "${#_FP[@]}" -gt 0 ] || return 0
  _jobs_done
  [ -e "$_D/side-$1.rc" ] && { _print "$_D/side-$1"; read -r _rc <"$_D/side-$1.rc"; }
  true
}

# _as_root FUNCTION [ARG...]: one of these functions run as root (in the privileged shell, or root already: as it is)
_as_root() {
  if [ "${#_S[@]}" -eq 0 ]; then "$@"; return; fi
  "${_S[@]}" bash -c "$(declare -f "$1"); \"\$@\"" _ "$@"
}

# the netplan revert guards still pending in the dirs given (fact_netplan_guards: netplan-guards.sh), where root can
# read them
fact_netplan_guards_pending() {
  if [ "$_SUDO_OK" = 1 ]; then _as_root fact_netplan_guards "$@"; else echo '#unreadable'; fi
}
