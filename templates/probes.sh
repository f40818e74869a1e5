#!/bin/bash
# shellcheck disable=SC2317 # a library: which functions a node's probe calls depends on the node
# doctor's probes on a node, the sections that are more than a command, one function each: sparkctl/doctor/probes.py
# says which sections a node runs (with what as arguments) and reads what each prints, and puts this file at the top
# of the node's probe script. Everything here only reads.

_has() { command -v "$1" >/dev/null 2>&1; }

# how root is reached: root already, else `sudo -n` when it works, else nothing (the user reads what they may)
_probes_begin() {
  if [ "$(id -u 2>/dev/null)" = 0 ]; then _S=()
  elif sudo -n true >/dev/null 2>&1; then _S=(sudo -n)
  else _S=(); fi
}

probe_versions() {
  printf 'kernel %s\n' "$(uname -r)"
  _has nvidia-smi || return 0
  printf 'driver %s\n' "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
  nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/cuda \1/p' | head -n 1
}

# probe_gids ABSENT: show_gids where it is installed; otherwise the same rows read from sysfs (where show_gids itself
# reads them); ABSENT when the node has no RDMA device at all
probe_gids() {
  if _has show_gids; then show_gids 2>&1; return; fi
  if [ ! -d /sys/class/infiniband ]; then echo "$1"; return; fi
  for d in /sys/class/infiniband/*; do [ -d "$d" ] || continue; dev=${d##*/}
    for pp in "$d"/ports/*; do [ -d "$pp" ] || continue; port=${pp##*/}
      for g in "$pp"/gids/*; do [ -e "$g" ] || continue; i=${g##*/}; gid=
        read -r gid < "$g" 2>/dev/null || continue
        case $gid in ""|0000:0000:0000:0000:0000:0000:0000:0000|fe80:0000:0000:0000:0000:0000:0000:0000) continue;; esac
        nd=; read -r nd < "$pp/gid_attrs/ndevs/$i" 2>/dev/null; ty=; read -r ty < "$pp/gid_attrs/types/$i" 2>/dev/null
        printf '%s\t%s\t%s\t%s\t\t%s\t%s\n' "$dev" "$port" "$i" "$gid" "$ty" "$nd"
      done
    done
  done
}

# probe_sshd_dropins KEYWORDS: the drop-in lines that set one of KEYWORDS (an ERE alternation), as FILE:LINE, in the
# order sshd reads them (as root when the file is not readable)
probe_sshd_dropins() {
  for f in /etc/ssh/sshd_config.d/*.conf; do [ -e "$f" ] || continue
    { if [ -r "$f" ]; then cat "$f"; else "${_S[@]}" cat "$f"; fi; } 2>/dev/null |
      grep -iE "^[[:space:]]*($1)[[:space:]=]" | sed "s|^|$f:|"
  done
}

# probe_model REPO LOCAL HUB: a model in the Hugging Face cache, in its --local-dir or the hub's folder: `absent`,
# `incomplete` (a partial download, or no config.json) or `complete`, with the repo
probe_model() {
  local d="" c
  for c in "$2" "$3"; do [ -d "$c" ] && { d=$c; break; }; done
  if [ -z "$d" ]; then echo "absent $1"
  elif [ -n "$(find "$d" -name '*.incomplete' 2>/dev/null | head -n 1)" ]; then echo "incomplete $1 partial download in $d"
  elif [ -z "$(find -L "$d" -name config.json 2>/dev/null | head -n 1)" ]; then echo "incomplete $1 no config.json in $d"
  else echo "complete $1"; fi
}

# probe_answers SECONDS NODE ADDRESS PORT [NODE ADDRESS PORT]...: a TCP connection to each, all at once (a port that
# drops it costs its wait once): `open NODE ADDRESS PORT` for each that accepted
probe_answers() {
  local wait=$1; shift
  while [ "$#" -ge 3 ]; do
    # shellcheck disable=SC2016 # the address and port are the inner shell's own arguments, never its text
    ( timeout "$wait" bash -c ': </dev/tcp/"$1"/"$2"' _ "$2" "$3" 2>/dev/null && echo "open $1 $2 $3" ) &
    shift 3
  done
  wait
}
