#!/bin/bash
# The cluster lock's holder on a node (sparkctl/runs/lock.py), left running over its connection: it holds flock on
# <state dir>/run.lock for as long as it lives, and names its run in run.holder. $1: the cluster, $2: this run's
# holder record (one line of JSON), $3: the lease in seconds (no heartbeat for that long: it ends, and the lock
# with it). Every line it prints starts with sparkctl-lock (runs/lock.py's MARK).
d="$HOME/.local/state/sparkctl/$1"
# the holder record as the shell reads it (its first 2000 characters, its line's end dropped): no `head` per read
holder() { h=; read -r -N 2000 h 2>/dev/null <"$d/run.holder"; h=${h%$'\n'}; }
command -v flock >/dev/null 2>&1 || {
  echo "sparkctl-lock error flock is not installed (sudo apt install util-linux)"; exit 1; }
[ -d "$d" ] || mkdir -p "$d" 2>/dev/null || { echo "sparkctl-lock error cannot open $d/run.lock"; exit 1; }
exec 9>>"$d/run.lock" || { echo "sparkctl-lock error cannot open $d/run.lock"; exit 1; }
if ! flock -n 9; then
  holder; echo "sparkctl-lock held $h"
  exit 0
fi
holder; prev=$h
# the record only names the holder (the flock is the lock): a node whose disk is full is still locked, and the
# run goes on to meet the full disk where it writes, on that node
if ! { printf '%s\n' "$2" > "$d/run.holder.new" && mv -f "$d/run.holder.new" "$d/run.holder"; }; then
  rm -f "$d/run.holder.new" "$d/run.holder"; echo "sparkctl-lock unrecorded"
fi
[ -n "$prev" ] && echo "sparkctl-lock stale $prev"
echo "sparkctl-lock acquired"
while IFS= read -r -t "$3" line; do
  if [ "$line" = release ]; then
    holder; [ "$h" = "$2" ] && rm -f "$d/run.holder"
    echo "sparkctl-lock released"
    exit 0
  fi
done
exit 0
