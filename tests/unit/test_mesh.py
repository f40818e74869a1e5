"""rules/mesh.py: the paced order of the mesh proofs, and the script's verdicts run against a stubbed ssh."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest

from sparkctl.rules import mesh
from sparkctl.rules.mesh import (
    WAVE,
    Ping,
    Try,
    mesh_script,
    mesh_timeout,
    missing_verdicts,
    parse_pings,
    parse_verdicts,
    ping_script,
    schedule,
    ssh_try,
    waves,
)


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_every_ordered_pair_once_and_each_step_targets_every_node_once(n):
    order = [f"spark{i}" for i in range(1, n + 1)]
    plans = {node: schedule(order, node) for node in order}
    pairs = {(node, peer) for node, peers in plans.items() for peer in peers}
    assert pairs == {(a, b) for a in order for b in order if a != b}
    for step in range(n - 1):
        # in each step every node is the target of exactly one try: no sshd gets a crowd
        assert Counter(plans[node][step] for node in order) == Counter(order)


def test_waves_bound_what_one_node_has_in_flight():
    tries = [ssh_try(f"p{i}", f"10.0.0.{i}") for i in range(10)]
    script = waves(tries, wave=4)
    blocks = script.split("wait")
    assert [b.count(" &") for b in blocks if b.strip()] == [4, 4, 2]
    assert mesh_timeout(10, wave=4) > mesh_timeout(4, wave=4)


STUB = """#!/bin/sh
# the stubbed ssh: -G answers the option probe; the target decides the outcome. Once "authenticated" it does what
# ssh -N does: runs LocalCommand, then holds the connection until something ends it.
case "$*" in *" -G "*|"-G "*) exit 0 ;; esac
case " $* " in *" -N "*) ;; *) echo "stub: a mesh try opens no session (-N)" >&2; exit 1 ;; esac
target=$(printf '%s\\n' "$@" | tail -n 1)
count="$STATE/$target"; n=$(cat "$count" 2>/dev/null || echo 0); echo $((n+1)) >"$count"
authenticated() {
  for a in "$@"; do case $a in LocalCommand=*) "${SHELL:-/bin/sh}" -c "${a#LocalCommand=}" ;; esac; done
  while :; do sleep 0.1; done
}
case $target in
  ok.*) authenticated "$@" ;;
  denied.*) echo "$target: Permission denied (publickey)." >&2; exit 255 ;;
  reset.*) echo "kex_exchange_identification: read: Connection reset by peer" >&2; exit 255 ;;
  flaky.*) [ "$n" -ge 1 ] && authenticated "$@"
           echo "kex_exchange_identification: Connection closed by remote host" >&2; exit 255 ;;
  silent.*) exit 0 ;;
  hung.*) while :; do sleep 0.1; done ;;
esac
exit 1
"""


def run_with_stub(tmp_path, tries: list[Try], shell: str = "/bin/sh") -> tuple[str, dict[str, int]]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "ssh").write_text(STUB)
    (bin_dir / "ssh").chmod(0o755)
    result = subprocess.run(["sh", "-c", mesh_script(tries)], capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STATE": str(state), "SHELL": shell})
    counts = {p.name: int(p.read_text()) for p in state.iterdir()}
    return result.stdout, counts


def test_verdicts_tell_broken_pairs_from_tries_that_could_not_run(tmp_path):
    tries = [ssh_try("a", "ok.a"), ssh_try("b", "denied.b"), ssh_try("c", "reset.c"), ssh_try("d", "flaky.d"),
             ssh_try("e", "silent.e")]
    stdout, counts = run_with_stub(tmp_path, tries)
    verdicts = {v.peer: v for v in parse_verdicts("n1", stdout)}
    assert verdicts["a"].state == "ok"
    assert verdicts["b"].state == "fail" and "Permission denied" in verdicts["b"].error
    # reset by the peer every time: retried, then "could not run", never "broken"
    assert verdicts["c"].state == "unknown" and "Connection reset" in verdicts["c"].error
    assert counts["reset.c"] == 3
    # reset once, then served: the pair is proven
    assert verdicts["d"].state == "ok" and counts["flaky.d"] == 2
    # a plain refusal is not retried
    assert counts["denied.b"] == 1
    # an ssh that ends without having been authenticated proves nothing, whatever its exit status
    assert verdicts["e"].state == "fail" and verdicts["e"].error == "exit status 0"


@pytest.mark.slow
def test_a_login_shell_that_is_not_posix_does_not_matter_and_a_silent_peer_is_cut_off(tmp_path, monkeypatch):
    """ssh runs LocalCommand with $SHELL (the user's login shell: fish has no $PPID, a wrapper would kill
    itself): the try gives ssh /bin/sh. A peer that accepts the connection and then says nothing is not waited
    for past TRY_LIMIT: the pair could not be checked."""
    monkeypatch.setattr(mesh, "TRY_LIMIT", 4)  # the limit is also the good try's: room for a few forks under load
    stdout, _ = run_with_stub(tmp_path, [ssh_try("a", "ok.a"), ssh_try("h", "hung.h")], shell="/bin/false")
    verdicts = {v.peer: v for v in parse_verdicts("n1", stdout)}
    assert verdicts["a"].state == "ok"
    assert verdicts["h"].state == "unknown" and verdicts["h"].error == "no answer within 4 s"


def test_a_try_goes_around_a_users_control_master():
    """Through a live ControlMaster nothing is authenticated (and LocalCommand never runs): a try never uses one."""
    argv = ssh_try("b", "10.0.0.2").argv
    assert "-o ControlMaster=no -o ControlPath=none" in argv and argv.startswith("ssh -N ")


def test_a_try_that_printed_nothing_is_unknown_not_broken():
    tries = [ssh_try("a", "10.0.0.1"), ssh_try("b", "10.0.0.2")]
    found = parse_verdicts("n1", "ok a 10.0.0.1\n")
    missing = missing_verdicts("n1", tries, found, "the check timed out")
    assert [(v.peer, v.state, v.error) for v in missing] == [("b", "unknown", "the check timed out")]


def test_the_script_is_valid_sh_and_quotes_values():
    script = mesh_script([ssh_try("x'; touch pwned; '", "10.0.0.1", "-p 22", user="root")])
    assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
    assert "'x'\"'\"'; touch pwned; '\"'\"''" in script
    assert len(script.split("&")) - 1 >= 1 and WAVE >= 1


def test_pings_are_retried_then_told_mtu_from_dead(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ping").write_text('#!/bin/sh\ncase "$*" in *"-M do"*10.0.0.2*) exit 1;; *10.0.0.3*) exit 1;; '
                                  'esac\nexit 0\n')
    (bin_dir / "ping").chmod(0o755)
    script = ping_script([Ping("eth0", "a", "10.0.0.1"), Ping("eth0", "b", "10.0.0.2"), Ping("eth1", "c", "10.0.0.3")],
                         8972)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin"}).stdout
    assert sorted(parse_pings(out)) == [("dead", "eth1", "c", "10.0.0.3"), ("mtu", "eth0", "b", "10.0.0.2"),
                                        ("ok", "eth0", "a", "10.0.0.1")]


def test_mpirun_may_take_longer_on_a_bigger_cluster():
    from sparkctl.plan.mpi import mpirun_timeout, probe_shell
    from sparkctl.transport.framing import Framing

    assert mpirun_timeout(2) == 68 and mpirun_timeout(16) == 124
    assert "timeout 124 mpirun -np 16" in probe_shell(16, Framing("n"))
