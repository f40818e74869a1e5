#!/bin/sh
# Netplan revert guards armed by a run and neither confirmed nor reverted, whose process still waits: a run cut
# (Ctrl-C, SIGKILL, a lost link) between `netplan apply` and its confirmation leaves one, and it reverts the files
# later unless confirmed. Run as root (the state dirs are 0700 root), with the dirs to look in as arguments;
# prints one guard id per line. Read by the facts (facts/sections.py) and by network.netplan before it applies.
for d in "$@"; do for p in "$d"/guard-*.pid; do
  [ -e "$p" ] || continue; id=${p##*/guard-}; id=${id%.pid}
  if [ -e "$d/confirmed-$id" ] || [ -e "$d/reverted-$id" ]; then continue; fi
  pid=; read -r pid < "$p" 2>/dev/null
  [ -n "$pid" ] && grep -q "revert-$id.sh" /proc/"$pid"/cmdline 2>/dev/null && printf '%s\n' "$id"
done; done; true
