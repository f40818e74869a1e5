#!/bin/bash
# Read-only (sparkctl/runs/lock.py): who holds the cluster lock now (flock taken and released at once), nothing
# written. $1: the cluster.
d="$HOME/.local/state/sparkctl/$1"
[ -e "$d/run.lock" ] || exit 0
exec 9<"$d/run.lock" || exit 0
if flock -n 9; then exit 0; fi
echo "held $(head -c 2000 "$d/run.holder" 2>/dev/null)"
