#!/bin/bash
# (sparkctl/runs/lock.py) stdin: the run id of a holder whose process is gone from this controller. Its node-side
# holders (bash processes of this user whose command line carries that id) are ended, and awaited (at most 5 s),
# which frees their flock. The id comes on stdin, not in argv: pkill -f would match, and end, this very script.
read -r r
u=$(id -u)
pkill -u "$u" -f -- "$r"
n=0
while pgrep -u "$u" -f -- "$r" >/dev/null && [ $n -lt 100 ]; do sleep 0.05; n=$((n+1)); done
true
