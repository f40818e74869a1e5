#!/bin/sh
# What only root may read of sshd, as digests: its files (0600 drop-ins) and `sshd -T` (it loads the host keys), for
# a login of the cluster user from each source address where Match blocks could tell them apart. Run by the login
# state's read (ssh-login-state.sh.j2) in ONE shell, as root where that takes no password, else as the user (then
# only the readable files' digest counts). $1: the cluster user, $2: sshd's port, then "source/local" pairs. Raw
# `sha256sum` lines, after `#files`; `sshd SOURCE ` (or `sshd * `) before each `sshd -T`'s.
_U=$1; _P=$2; shift 2
echo '#files'; sha256sum /etc/ssh/sshd_config /etc/ssh/sshd_config.d/*.conf 2>/dev/null
_D=/usr/sbin/sshd; [ -x "$_D" ] || _D=$(command -v sshd 2>/dev/null || echo /usr/sbin/sshd)
# a Match block in any of them (as `grep -qisE '^[[:space:]]*match[[:space:]]'` finds one), read by the shell
_m=
for _f in /etc/ssh/sshd_config /etc/ssh/sshd_config.d/*.conf; do
  [ -r "$_f" ] || continue
  while IFS= read -r _l || [ -n "$_l" ]; do
    _l=${_l#"${_l%%[![:space:]]*}"}
    case $_l in [Mm][Aa][Tt][Cc][Hh][[:space:]]*) _m=1; break 2 ;; esac
  done <"$_f"
done
if [ -n "$_m" ]; then
  for _a in "$@"; do
    _src=${_a%%/*}; _l=${_a#*/}
    printf 'sshd %s ' "$_src"; "$_D" -T -C "user=$_U,host=$_src,addr=$_src,laddr=$_l,lport=$_P" 2>&1 | sha256sum
  done
else
  printf 'sshd * '; "$_D" -T 2>&1 | sha256sum
fi
true
