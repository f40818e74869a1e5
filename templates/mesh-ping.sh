#!/bin/sh
# _ping IFACE PEER ADDRESS SIZE TRIED: a don't-fragment ping of SIZE bytes out of IFACE, tried twice (TRIED times
# already), before a small ping tells an MTU problem (`mtu`) from a dead link (`dead`); one line:
# `VERDICT IFACE PEER ADDRESS` (sparkctl/rules/mesh.py makes each first try itself, a few at a time, and calls this
# for those that were not answered). Each waits 1 s for its reply.
_ping() { _i=$1; _p=$2; _a=$3; _s=$4; _n=$5
  while :; do _n=$((_n+1))
    if ping -c 1 -W 1 -M 'do' -s "$_s" -I "$_i" "$_a" >/dev/null 2>&1; then echo "ok $_i $_p $_a"; return; fi
    [ "$_n" -lt 2 ] && continue
    if ping -c 1 -W 1 -I "$_i" "$_a" >/dev/null 2>&1; then echo "mtu $_i $_p $_a"; else echo "dead $_i $_p $_a"; fi
    return
  done
}
