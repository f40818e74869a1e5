#!/bin/bash
# shellcheck disable=SC2317 # a library: which functions a node's script calls depends on what it asks
# The facts' sections, one function each, and what runs them: sparkctl/facts/sections.py says which sections a node
# runs (and with what arguments) and reads what each prints; sparkctl/facts/script.py puts this file at the top of a
# node's facts script and calls them, each in its framed section. A missing command only makes its section empty.
# `_S` is what runs a command as root (empty as root already, and in the privileged shell), `_SUDO_OK` 1 when that
# works.

# Run a command under `timeout` when the node has it, so that a hung daemon (docker) cannot eat the round trip.
_t() { if command -v timeout >/dev/null 2>&1; then timeout "$@"; else shift; "$@"; fi; }
_has() { command -v "$1" >/dev/null 2>&1; }

fact_hostname() { hostname 2>/dev/null || cat /proc/sys/kernel/hostname; }
fact_os_release() { cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release; }
fact_dgx_release() { cat /etc/dgx-release 2>/dev/null; }
fact_arch() { uname -m; }
fact_id() { id -un; id -u; id -Gn; }
fact_home() { printf '%s\n' "$HOME"; }
fact_ip_addr() { ip -j -d addr show; }
fact_ssh_connection() { printf '%s\n' "${SSH_CONNECTION:-}"; }
fact_routes() { ip -4 -o route show table main 2>/dev/null; }
fact_docker_cli() { command -v docker; }
fact_meminfo() { cat /proc/meminfo; }
fact_time() { date +%s.%N; }

# `read` instead of `$(cat ...)`: no fork per interface (forks are most of this script's cost)
fact_carrier() {
  for f in /sys/class/net/*/carrier; do
    [ -e "$f" ] || continue; n=${f%/carrier}; n=${n##*/}; c=
    read -r c < "$f" 2>/dev/null
    printf '%s %s\n' "$n" "$c"
  done
}

# ibdev2netdev prints the netdev's operstate; the sysfs fallback prints the same line shape
fact_roce() {
  if _has ibdev2netdev; then ibdev2netdev; return; fi
  for d in /sys/class/infiniband/*; do
    [ -d "$d" ] || continue; dev=${d##*/}
    port=1; for p in "$d"/ports/*; do [ -e "$p" ] && { port=${p##*/}; break; }; done
    for n in "$d"/device/net/*; do
      [ -e "$n" ] || continue; nd=${n##*/}
      st=Down; o=; read -r o < /sys/class/net/"$nd"/operstate 2>/dev/null; [ "$o" = up ] && st=Up
      printf '%s port %s ==> %s (%s)\n' "$dev" "$port" "$nd" "$st"
    done
  done
}

# lldpcli is setuid _lldpd, mode 4750 _lldpd:adm on Debian/Ubuntu (and /usr/sbin is not in a user's PATH over ssh):
# found by path, asked as root when that works. Only read: sparkctl never starts lldpd itself.
fact_lldp() {
  _L=$(command -v lldpcli 2>/dev/null)
  for p in /usr/sbin/lldpcli /usr/local/sbin/lldpcli; do [ -z "$_L" ] && [ -e "$p" ] && _L=$p; done
  if [ -z "$_L" ]; then echo '#absent'; else _t 10 "${_S[@]}" "$_L" show neighbors -f json 2>&1; fi
}

fact_speed() {
  for f in /sys/class/net/*/speed; do
    [ -e "$f" ] || continue; n=${f%/speed}; n=${n##*/}; v=
    read -r v < "$f" 2>/dev/null
    printf 'sysfs %s %s\n' "$n" "$v"
  done
  _has ethtool || return 0
  for n in /sys/class/infiniband/*/device/net/*; do
    [ -e "$n" ] || continue; nd=${n##*/}
    sp=$(ethtool "$nd" 2>/dev/null | sed -n 's/^[[:space:]]*Speed:[[:space:]]*//p')
    printf 'ethtool %s %s\n' "$nd" "$sp"
  done
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

# netplan's files are 0600 root: read as root when that works; base64 keeps any content intact
fact_netplan() {
  for f in /etc/netplan/*.yaml; do
    [ -e "$f" ] || continue
    mode=$(stat -c %a "$f" 2>/dev/null || echo -)
    c=-
    if [ -r "$f" ]; then
      if c=$(base64 < "$f" | tr -d '\n'); then c="b64:$c"; else c=-; fi
    elif [ "$_SUDO_OK" = 1 ]; then
      if c=$("${_S[@]}" cat "$f" 2>/dev/null | base64 | tr -d '\n'); then c="b64:$c"; else c=-; fi
    fi
    printf '%s %s %s\n' "$mode" "$c" "$f"
  done
}

# NetworkManager's view, when nmcli exists (DGX OS renders netplan through it): C locale for the words it prints;
# readable by any user over D-Bus; nothing more is asked once it says it is not running. Three calls: each costs
# ~50 ms of the round trip. Parsed in sparkctl/facts/networkmanager.py.
fact_nm() {
  if ! _has nmcli; then echo '#absent'; return; fi
  local -x LC_ALL=C
  local c u
  echo '#devices'; _t 5 nmcli -t -f DEVICE,TYPE,STATE,CONNECTION device status 2>&1 || return 0
  echo '#connections'
  c=$(_t 5 nmcli -t -f UUID,NAME,TYPE,DEVICE,ACTIVE,AUTOCONNECT,AUTOCONNECT-PRIORITY,FILENAME connection show 2>&1)
  printf '%s\n' "$c"
  echo '#settings'; mapfile -t u < <(printf '%s\n' "$c" | cut -d: -f1 | grep -E '^[0-9a-fA-F-]{36}$')
  if [ "${#u[@]}" -gt 0 ]; then
    _t 5 nmcli -t -f connection.uuid,connection.interface-name,802-3-ethernet.mac-address connection show "${u[@]}" 2>&1
  fi
}

# with nothing to inspect, `docker ps` tells whether this user can talk to the daemon (Docker and Podman)
fact_docker_info() { _has docker && { _t 15 docker ps -q >/dev/null; } 2>&1; }

# ONE docker command for everything docker knows that sparkctl asks (arguments: the containers and images): each
# docker call costs a client start, a daemon round trip and, with podman, its storage locks. Its stderr is kept,
# each line marked `#err `: "no such object" is an answer, a refused socket or a broken storage is not.
fact_docker() {
  _has docker || return 1
  _e=$(mktemp 2>/dev/null || echo "/tmp/.sfi.$$")
  _t 15 docker inspect "$@" 2>"$_e"; _r=$?
  sed 's/^/#err /' "$_e"; rm -f "$_e"; return "$_r"
}

# the Hugging Face cache (argument, its `~` expanded by the call): where it is, the space free there (df needs an
# existing path: the nearest existing parent), and the model pins sparkctl keeps in it
fact_hf_cache() {
  p=$1
  printf '%s\n' "$p"
  d=$p; while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done
  df -B1 --output=avail "$d" 2>/dev/null | tail -n 1
  for f in "$p"/sparkctl-pins/models--*; do
    [ -f "$f" ] && printf 'pin\t%s\t%s\n' "${f##*/}" "$(head -n1 "$f")"
  done; true
}

fact_ss() { if [ "$_SUDO_OK" = 1 ]; then "${_S[@]}" ss -ltnpH 2>/dev/null || ss -ltnH; else ss -ltnpH; fi; }

# root already, or `sudo -n` ran the privileged shell: sudo asked once, by that shell
fact_sudo() { [ "$_SUDO_OK" = 1 ]; }

# sparkctl's firewall files (arguments: the rules, the listing, the unit; 644, no secret in them), each after its
# marker, absent ones left out, then whether the unit is enabled
fact_firewall_files() {
  _unit=$1; shift
  for _f in "$@"; do [ -f "$_f" ] && { echo "#file $_f"; cat "$_f"; }; done
  echo '#enabled'; systemctl is-enabled "$_unit" 2>/dev/null; true
}

fact_firewall() {
  if _has ufw; then echo '#ufw'; "${_S[@]}" ufw status 2>&1; fi
  if _has nft; then echo '#nft'; "${_S[@]}" nft list ruleset 2>&1; fi
  if _has iptables; then echo '#iptables'; "${_S[@]}" iptables -S INPUT 2>&1; fi
}

# _held NAME: a background or privileged section's output, and its exit status in _rc (empty: it was cut short), once
# the facts' own background jobs are done (not the side reads)
_held() {
  wait "${_FP[@]}"
  cat "$_D/$1"; _rc=1; read -r _rc <"$_D/$1.rc"
}

# The script's start: its clock (bash's $SECONDS, whole seconds), its private temp dir (none: every section runs in
# order, and no side read runs), and how root is reached: root already, else `sudo -n`, which the privileged shell
# tries once when there is a temp dir, and which is asked here when there is none.
_facts_begin() {
  _T0=$SECONDS; _FP=(); _SP=(); _TO=""; _has timeout && _TO=timeout
  _D=$(mktemp -d 2>/dev/null) || _D=""
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
    "${_S[@]}" bash -c "$(declare -f "${_PF[@]}"); _privileged \"\$@\"" _ "$_D" 1 2>/dev/null ||
      [ -e "$_D/.privileged" ] ||
      ( _privileged "$_D" 0 )
  else
    ( _privileged "$_D" "$_SUDO_OK" )
  fi
}

# In the root shell: umask 022, so that the user reads what root wrote (sudo keeps a stricter umask of theirs: 027
# would leave every section unreadable); set -C: root never writes through a file or link already there (the dir is
# the user's); a dir root may not enter (root-squashed NFS) fails the shell before its mark, and the user's runs.
_privileged_begin() {
  _S=(); _SUDO_OK=$2; export LC_ALL=C; umask 022; cd "$1" || exit 1; set -C
  : >.privileged
}

# _side I SECONDS SCRIPT: a later task's read-only SCRIPT, in the background beside the facts, bounded by SECONDS;
# `timeout` is the job itself (not through _t), so that its PID is known: stopped, it stops the whole read (it leads
# its own process group and passes the signal on). Nothing of the round trip's stdin or stdout (nor fd 3, its held
# stdout) stays open in it: one left behind must not hold the channel. side-I.job: the job's shell, side-I.pid: the
# read, side-I.rc: its exit status, once done.
_side() {
  local to=()
  [ -n "$_TO" ] && to=(timeout "$2")
  { "${to[@]}" bash -c "$3" >"$_D/side-$1" 2>/dev/null & echo $! >"$_D/side-$1.pid"; wait $!
    echo $? >"$_D/side-$1.rc"; } </dev/null >/dev/null 2>&1 3>&- &
  echo $! >"$_D/side-$1.job"; _SP+=("$!")
}

# _sides_wait GRACE: once the facts are read, the side reads get GRACE seconds more, or as long again as the facts
# took (a node under load is as slow for both); one still running then is stopped (its job's shell first, so that
# it leaves no exit status, then the read) and left out: its task reads for itself. The wait ends the moment the
# last one does; the stopper holds nothing of the round trip's output open.
_sides_wait() {
  [ "${#_SP[@]}" -gt 0 ] || return 0
  local grace=$((SECONDS - _T0))
  [ "$grace" -lt "$1" ] && grace=$1
  { sleep "$grace"
    for _j in "$_D"/side-*.job; do
      _s=${_j%.job}; [ -e "$_s.rc" ] && continue
      _jp=; _rp=; read -r _jp <"$_j"; read -r _rp <"$_s.pid" 2>/dev/null
      kill "$_jp" ${_rp:+"$_rp"} 2>/dev/null
    done; } </dev/null >/dev/null 2>&1 3>&- &
  local stopper=$!
  wait "${_SP[@]}" 2>/dev/null; kill "$stopper" 2>/dev/null
}

# _side_out I: a side read's output, and its exit status in _rc (1 and nothing when it did not finish)
_side_out() {
  _rc=1
  [ -n "$_D" ] && [ -e "$_D/side-$1.rc" ] || return 0
  cat "$_D/side-$1"; read -r _rc <"$_D/side-$1.rc"
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
