"""The mesh proofs on record (tasks/proof.py PairProofs, tasks/ssh/proofs.py): a no-op rerun tries exactly the
node-to-node pairs whose fingerprint changed; --reprove tries every pair; a pair that fails leaves the record."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time

import pytest

from sparkctl.rules.mesh import host_tries, prelude
from sparkctl.rules.sshd import blame, effective_settings, parse_config_lines, sshd_problem
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks import proof
from sparkctl.tasks.context import RunOptions
from sparkctl.tasks.proof import PairProofs, pair_id
from sparkctl.tasks.ssh.keys import SshKeyTask
from sparkctl.tasks.ssh.mesh import SshMeshTask, read_ssh_files
from sparkctl.tasks.ssh.proofs import HOST_MESH, host_fingerprints, login_script, parse_login, source_addresses
from sparkctl.tasks.ssh.verify import SshVerify
from tests.taskkit import Records, framed, inventory, make_kit, nonce_of, spark_facts, ssh_read_output

FABRIC = {"spark1": {"enp1s0f1np1": ["192.168.100.10/24"], "enP2p1s0f1np1": ["192.168.101.10/24"]},
          "spark2": {"enp1s0f1np1": ["192.168.100.11/24"], "enP2p1s0f1np1": ["192.168.101.11/24"]}}
PEER = {"spark1": ("spark2", "192.168.100.11"), "spark2": ("spark1", "192.168.100.10")}
TO_SPARK2 = pair_id("spark1", "spark2", "192.168.100.11")
TO_SPARK1 = pair_id("spark2", "spark1", "192.168.100.10")
#: how ssh.verify's own mesh scripts begin (its tries follow)
MESH_SCRIPT = prelude()
#: a `login` section as ssh-login-state.sh.j2 prints it
LOGIN = ("boot b1\nstat 1 2 3 600 1000 /home/nvidia/.ssh/sparkctl-spark-pair_ed25519\n"
         "stat 10 4096 5 750 1000 /home/nvidia\nstat 11 4096 5 700 1000 /home/nvidia/.ssh\n"
         "stat 12 100 5 600 1000 /home/nvidia/.ssh/authorized_keys\n#client\nc  /etc/ssh/ssh_config\n"
         "groups nvidia sudo\npasswd nvidia:x:1000:1000::/home/nvidia:/bin/bash\n#service\nMainPID=s\n#root\n"
         "#files\nf  /etc/ssh/sshd_config\nsshd * d  -\n")


def converged_states() -> dict[str, dict]:
    """Both nodes' ~/.ssh as ssh.mesh leaves them, and their `login` sections."""
    files = {n: {"pub": f"ssh-ed25519 K{n[-1]} sparkctl-spark-pair@{n}", "hostkey": f"ssh-ed25519 H{n[-1]}"}
             for n in PEER}
    kit = make_kit(inventory(), {n: spark_facts(n, addresses=FABRIC[n], mtu=9000) for n in files})
    for node, node_files in files.items():
        kit.transport(node).respond(r":begin pub@@", ssh_read_output(node_files))
    desired = SshMeshTask().desired(kit.cluster, read_ssh_files(kit.cluster))
    return {n: dict(files[n], **desired[n], login=LOGIN) for n in files}


def repaired(states: dict[str, dict]) -> None:
    """The files ssh.mesh would write for these keys, as if it had."""
    kit = kit_over(states, Records())
    states.update({n: dict(states[n], **want)
                   for n, want in SshMeshTask().desired(kit.cluster, read_ssh_files(kit.cluster)).items()})


def kit_over(states, records, *, fail: set[str] = frozenset(), options: RunOptions | None = None):
    """A run over these nodes' states and this record; a try of a pair in `fail` is denied."""
    kit = make_kit(inventory(), {n: spark_facts(n, addresses=FABRIC[n], mtu=9000) for n in states}, options)
    kit.cluster.records = records
    for node, state in states.items():
        peer, address = PEER[node]
        pair = pair_id(node, peer, address)
        verdict = (f"fail {peer} {address} Permission denied (publickey).\n" if pair in fail
                   else f"ok {peer} {address}\n")
        kit.transport(node).respond(r":begin pub@@", ssh_read_output(state))
        kit.transport(node).respond(rf"\A{re.escape(MESH_SCRIPT)}", verdict)
    return kit


def with_key(state: dict, mesh: str | None = None):
    """ssh.keys' read: the key there, the files and the login section (and the tries' verdicts, `mesh`)."""
    files = ssh_read_output(state)

    def answer(script: str) -> str:
        nonce = nonce_of(script)
        tried = f"@@sparkctl:{nonce}:begin mesh@@\n{mesh}@@sparkctl:{nonce}:end mesh 0@@\n" if mesh else ""
        return f"@@sparkctl:{nonce}:begin key@@\n\n@@sparkctl:{nonce}:end key 0@@\n" + files(script) + tried

    answer.wants_script = True
    return answer


def tried(kit) -> set[str]:
    """The pairs ssh.verify tried in this run (its own mesh scripts)."""
    return {pair_id(node, *PEER[node]) for node in PEER
            if any(c.startswith(MESH_SCRIPT) for c in kit.transport(node).commands)}


def verify(kit) -> str:
    """ssh.mesh finds nothing to change, ssh.verify passes; its log line."""
    assert SshMeshTask().check(kit.cluster) == []
    assert SshVerify().check(kit.cluster) == []
    return [e.message for e in kit.events if e.event == "log" and e.task == "ssh.verify"][-1]


def test_a_rerun_takes_every_unchanged_pair_from_the_record_and_tries_none():
    states, records = converged_states(), Records()
    first = kit_over(states, records)
    assert "0 of 2 pair(s) taken from the record" in verify(first)
    assert tried(first) == {TO_SPARK1, TO_SPARK2}
    assert set(records[HOST_MESH]) == {TO_SPARK1, TO_SPARK2}
    again = kit_over(states, records)
    assert verify(again) == ("2 of 2 pair(s) taken from the record (nothing their login depends on changed), "
                             "0 proven in ssh.keys' read, 0 tried now")
    assert tried(again) == set()


@pytest.mark.parametrize("node, field, value", [
    ("spark2", "authorized_keys", "ssh-ed25519 K1 sparkctl-spark-pair@spark1\nssh-ed25519 OTHER someone\n"),
    ("spark2", "hostkey", "ssh-ed25519 H2-new"),                          # spark1's known_hosts follows it
    # StrictModes would refuse the key
    ("spark2", "login", LOGIN.replace("750 1000 /home/nvidia\n", "770 1000 /home/nvidia\n")),
    ("spark2", "login", LOGIN.replace("sshd * d ", "sshd * d2 ")),       # sshd's effective configuration
    ("spark2", "login", LOGIN.replace("boot b1", "boot b2")),          # rebooted: its sshd started anew
    ("spark2", "login", LOGIN.replace("MainPID=s", "MainPID=s2")),     # ssh.service restarted or reloaded
    ("spark1", "pub", "ssh-ed25519 K1-new sparkctl-spark-pair@spark1"),   # spark2's authorized_keys follows it
    ("spark1", "login", LOGIN.replace("stat 1 2 3", "stat 1 2 4")),      # the private key file rewritten
    ("spark1", "config", "Host *\n    ForwardAgent yes\n"),             # a block of the user's own
    ("spark1", "login", LOGIN.replace("c  /etc/ssh/ssh_config", "c2  /etc/ssh/ssh_config")),  # /etc/ssh/ssh_config
])
def test_a_change_that_one_pair_depends_on_makes_exactly_that_pair_tried_again(node, field, value):
    states, records = converged_states(), Records()
    verify(kit_over(states, records))
    before = dict(records[HOST_MESH])
    if field == "config":
        value = states[node][field] + value
    states[node][field] = value
    repaired(states)  # what ssh.mesh writes when a key changed
    kit = kit_over(states, records)
    verify(kit)
    assert tried(kit) == {TO_SPARK2}
    assert records[HOST_MESH][TO_SPARK1] == before[TO_SPARK1]
    assert records[HOST_MESH][TO_SPARK2][0] != before[TO_SPARK2][0]


def test_a_node_losing_an_address_retries_every_pair_it_is_in():
    states, records = converged_states(), Records()
    verify(kit_over(states, records))
    kit = kit_over(states, records)
    kit.node("spark2").facts().interfaces["enP2p1s0f1np1"].operstate = "DOWN"
    verify(kit)
    assert tried(kit) == {TO_SPARK1, TO_SPARK2}


def test_reprove_tries_every_pair_and_an_old_proof_counts_for_nothing():
    states, records = converged_states(), Records()
    verify(kit_over(states, records))
    kit = kit_over(states, records, options=RunOptions(reprove=True))
    verify(kit)
    assert tried(kit) == {TO_SPARK1, TO_SPARK2}
    records[HOST_MESH][TO_SPARK1][1] = time.time() - proof.MAX_AGE_S - 60
    kit = kit_over(states, records)
    verify(kit)
    assert tried(kit) == {TO_SPARK1}


def test_a_pair_that_fails_leaves_the_record_and_is_tried_by_the_next_run():
    states, records = converged_states(), Records()
    verify(kit_over(states, records))
    # a drop-in that turns key login off
    states["spark2"]["login"] = LOGIN.replace("f  /etc/ssh/sshd_config", "f2  /etc/ssh/sshd_config")
    kit = kit_over(states, records, fail={TO_SPARK2})
    assert SshMeshTask().check(kit.cluster) == []
    with pytest.raises(TaskFailed, match="1 node-to-node ssh connection"):
        SshVerify().check(kit.cluster)
    assert set(records[HOST_MESH]) == {TO_SPARK1}
    kit = kit_over(states, records)  # the same fingerprint as on the failed run: tried all the same
    verify(kit)
    assert tried(kit) == {TO_SPARK2}


def test_ssh_keys_carries_the_tries_only_while_a_pair_has_no_proof_and_keeps_a_read_without_them():
    states, records = converged_states(), Records()
    kit = kit_over(states, records)
    for node in PEER:
        kit.transport(node).respond(r"begin key@@", with_key(states[node]))
        kit.transport(node).rules.insert(0, kit.transport(node).rules.pop())  # before the files' own answer
        SshKeyTask().check(kit.node(node))
    sent = kit.transport("spark1").commands[-1]
    assert "_try spark2 192.168.100.11" in sent
    kept = kit.cluster.reads_ahead._seen["spark1"]["ssh.keys"][0]
    assert "_try" not in kept and "begin login@@" in kept
    verify(kit)
    kit = kit_over(states, records)
    for node in PEER:
        kit.transport(node).respond(r"begin key@@", with_key(states[node]))
        kit.transport(node).rules.insert(0, kit.transport(node).rules.pop())  # before the files' own answer
        SshKeyTask().check(kit.node(node))
    assert "_try" not in kit.transport("spark1").commands[-1]


def test_a_pair_that_failed_in_ssh_keys_read_is_tried_again_though_its_proof_is_on_record():
    """The record missed what broke it (ssh.keys tried the pair because another pair of its node was off the
    record): ssh.verify tries it again and that answer decides."""
    states, records = converged_states(), Records()
    verify(kit_over(states, records))
    kit = kit_over(states, records, fail={TO_SPARK2})
    for node in PEER:
        peer, address = PEER[node]
        verdict = f"{'fail' if node == 'spark1' else 'ok'} {peer} {address} Permission denied (publickey).\n"
        kit.transport(node).respond(r"begin key@@", with_key(states[node], mesh=verdict))
        kit.transport(node).rules.insert(0, kit.transport(node).rules.pop())
        SshKeyTask().check(kit.node(node))
    assert SshMeshTask().check(kit.cluster) == []
    with pytest.raises(TaskFailed, match="1 node-to-node ssh connection"):
        SshVerify().check(kit.cluster)
    assert tried(kit) == {TO_SPARK2}
    assert set(records[HOST_MESH]) == {TO_SPARK1}


def test_sshd_seen_from_each_source_when_a_match_block_could_tell_them_apart():
    """With a Match block the peer prints one `sshd -T` digest per source address: a drop-in for one subnet
    changes the pairs from there only."""
    states = converged_states()
    kit = kit_over(states, Records())
    sources = {src for src, _ in source_addresses(kit.cluster, "spark2")}
    assert {"192.168.100.10", "192.168.101.10"} <= sources
    per_source = "boot b\n" + "".join(f"sshd {s} d\n" for s in sorted(sources))
    inputs = {n: dict(states[n], login=per_source) for n in PEER}
    tries = {"spark1": host_tries(kit.cluster.inventory, kit.cluster.plan().fabric, list(PEER), "spark1")}
    before = host_fingerprints(kit.cluster, inputs, tries)
    inputs["spark2"]["login"] = per_source.replace("sshd 192.168.101.10 d", "sshd 192.168.101.10 other")
    assert host_fingerprints(kit.cluster, inputs, tries) != before
    inputs["spark2"]["login"] = per_source + "sshd 192.168.100.99 other\n"  # not spark1's address
    assert host_fingerprints(kit.cluster, inputs, tries) == before


def test_the_account_is_the_facts_groups_and_the_login_s_shell_as_the_login_state_printed_it_before():
    """The login state no longer asks `id -Gn` and `getent` (two processes on every rerun): the groups are the
    facts', the shell the login's own $SHELL. The account they make is the one the older state made, so proofs on
    record hold across the upgrade; a group or a shell that changes still makes a new fingerprint."""
    older = parse_login("groups nvidia sudo\npasswd nvidia:x:1000:1000::/home/nvidia:/bin/bash\n")
    assert parse_login("shell /bin/bash\n", ["nvidia", "sudo"])["account"] == older["account"]
    assert older["account"] == "nvidia,sudo /bin/bash"
    assert parse_login("passwd nvidia:x:1000:1000::/home/nvidia:/bin/sh\nnologin\n", ["nvidia"])["account"] == (
        "nvidia /bin/sh nologin")  # no $SHELL: the entry getent gave
    states = converged_states()
    kit = kit_over(states, Records())
    login = LOGIN.replace("groups nvidia sudo\npasswd nvidia:x:1000:1000::/home/nvidia:/bin/bash\n",
                          "shell /bin/bash\n")
    inputs = {n: dict(states[n], login=login) for n in PEER}
    tries = {"spark1": host_tries(kit.cluster.inventory, kit.cluster.plan().fabric, list(PEER), "spark1")}
    before = host_fingerprints(kit.cluster, inputs, tries)
    groups = kit.node("spark2").facts().groups
    kept = list(groups)
    groups.remove("sudo")
    assert host_fingerprints(kit.cluster, inputs, tries) != before
    groups[:] = kept
    assert host_fingerprints(kit.cluster, inputs, tries) == before
    inputs["spark2"]["login"] = login.replace("shell /bin/bash", "shell /usr/sbin/nologin")
    assert host_fingerprints(kit.cluster, inputs, tries) != before


def test_parse_login():
    assert parse_login(LOGIN + "sshd 10.0.0.1 x\n")["sshd 10.0.0.1"] == "x"
    assert parse_login(None) == {}


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/sbin/sshd"), reason="needs root and sshd")
def test_the_login_section_runs_for_real(tmp_path):
    kit = kit_over(converged_states(), Records())
    script = login_script(kit.cluster, "spark2", "sparkctl-spark-pair_ed25519")
    # what goes through `sudo -n sh -c` (a line of the auth log) carries no comments
    assert "What only root may read" not in script and "_U=$1; _P=$2" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "sparkctl-spark-pair_ed25519").write_text("k")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(tmp_path)})
    login = parse_login(out.stdout)
    assert {"boot", "key", "client", "perms", "files"} <= set(login), out
    assert login["key"] and len(login["files"]) == 16
    digests = [v for k, v in login.items() if k.startswith("sshd ")]
    assert digests and all(len(d) == 16 for d in digests), out


def test_pair_proofs_keep_forget_and_refuse_a_malformed_record():
    records = Records({HOST_MESH: {"a b c": ["fp", time.time()], "bad": "x", "old": ["fp", 0]}})
    proofs = PairProofs(records, HOST_MESH)
    assert proofs.covers(["a b c"]) and not proofs.covers(["a b c", "old"])
    assert proofs.proven({"a b c": "fp", "d e f": "fp"}) == {"a b c"}
    assert proofs.proven({"a b c": "other"}) == set()
    proofs.keep({"a b c": "fp", "d e f": "fp2"}, passed={"d e f"}, taken={"a b c"})
    assert set(records[HOST_MESH]) == {"a b c", "d e f"}
    proofs.forget(["d e f"])
    assert set(records[HOST_MESH]) == {"a b c"}
    assert PairProofs(records, HOST_MESH, reprove=True).proven({"a b c": "fp"}) == set()
    written = dict(records)
    PairProofs(records, HOST_MESH).keep({"a b c": "fp"}, passed=set(), taken={"a b c"})
    assert records == written  # nothing changed: nothing written


def test_a_refused_key_is_explained_by_the_line_of_sshds_configuration_that_keeps_it_out():
    states, records = converged_states(), Records()
    kit = kit_over(states, records, fail={TO_SPARK2})
    effective = "192.168.100.10 pubkeyauthentication no\n192.168.101.10 pubkeyauthentication no\n"
    lines = ("/etc/ssh/sshd_config:30:PubkeyAuthentication yes\n"
             "/etc/ssh/sshd_config.d/60-fabric.conf:1:Match Address 192.168.100.0/24,192.168.101.0/24\n"
             "/etc/ssh/sshd_config.d/60-fabric.conf:2:    PubkeyAuthentication no\n")
    kit.transport("spark2").respond(r"begin effective@@", framed([("effective", effective), ("lines", lines)]))
    assert SshMeshTask().check(kit.cluster) == []
    with pytest.raises(TaskFailed) as err:
        SshVerify().check(kit.cluster)
    assert err.value.details[-1] == (
        "spark2: /etc/ssh/sshd_config.d/60-fabric.conf:2: PubkeyAuthentication no (in `Match Address "
        "192.168.100.0/24,192.168.101.0/24`): public-key login is off: the mesh logs in with keys only (logins from "
        "192.168.100.10, 192.168.101.10)")
    assert "sudo systemctl reload ssh" in err.value.hint
    script = next(c for c in kit.transport("spark2").commands if "begin effective@@" in c)
    assert "192.168.100.10/192.168.100.11 192.168.101.10/192.168.101.11" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_blame_takes_a_matching_block_over_the_global_line_and_a_global_line_alone():
    lines = parse_config_lines("/etc/ssh/sshd_config:12:AllowUsers root admin\n"
                               "/etc/ssh/sshd_config:40:Match User backup\n"
                               "/etc/ssh/sshd_config:41:  AllowUsers backup\n"
                               "/etc/ssh/sshd_config:50:Match all\n"
                               "/etc/ssh/sshd_config:51:AuthenticationMethods=password\n")
    assert [str(c) for c in lines] == ["/etc/ssh/sshd_config:12: AllowUsers root admin",
                                       "/etc/ssh/sshd_config:41: AllowUsers backup (in `Match User backup`)",
                                       "/etc/ssh/sshd_config:51: AuthenticationMethods password"]
    found = blame({"allowusers": "root admin", "authenticationmethods": "password", "denyusers": "x"}, lines)
    assert [str(found[k]) for k in ("allowusers", "authenticationmethods")] == [
        "/etc/ssh/sshd_config:12: AllowUsers root admin", "/etc/ssh/sshd_config:51: AuthenticationMethods password"]
    assert found["denyusers"] is None


def test_doctor_takes_a_pair_it_found_broken_off_the_record():
    from types import SimpleNamespace

    from sparkctl.doctor.snapshot import NodeProbe, SshProbe
    from sparkctl.runs.doctor import forget_broken_pairs
    from sparkctl.tasks.container.proofs import CONTAINER_MESH

    now = time.time()
    records = Records({HOST_MESH: {TO_SPARK1: ["a", now], TO_SPARK2: ["b", now]},
                       CONTAINER_MESH: {"spark1 spark2 root@192.168.100.11": ["c", now]}})
    probes = {"spark1": NodeProbe(ssh=[SshProbe("spark2", "192.168.100.11", False, "Permission denied", "fail")],
                                  container_ssh=[SshProbe("spark2", "root@192.168.100.11", True, "", "ok")]),
              "spark2": NodeProbe(ssh=[SshProbe("spark1", "192.168.100.10", True, "", "ok")])}
    forget_broken_pairs(SimpleNamespace(probes=probes), records)
    assert set(records[HOST_MESH]) == {TO_SPARK1}
    assert set(records[CONTAINER_MESH]) == {"spark1 spark2 root@192.168.100.11"}


def test_sshd_lists_printed_one_entry_a_line_are_judged_whole_and_a_second_factor_keeps_a_key_out():
    """`sshd -T` prints AllowUsers/AllowGroups one entry per line (OpenSSH servconf.c dump_cfg_strarray)."""
    effective = effective_settings([("allowusers", "alice"), ("allowusers", "nvidia"), ("pubkeyauthentication", "yes")])
    assert effective == {"allowusers": "alice nvidia", "pubkeyauthentication": "yes"}
    assert sshd_problem("AllowUsers", effective["allowusers"], "nvidia", [], 2) is None
    assert sshd_problem("AllowUsers", "alice", "nvidia", [], 2) == "nvidia is not among AllowUsers alice"
    assert sshd_problem("AuthenticationMethods", "publickey,password", "nvidia", [], 2) == (
        "AuthenticationMethods publickey,password leaves no login by a key alone")
    assert sshd_problem("AuthenticationMethods", "publickey,password publickey", "nvidia", [], 2) is None
    lines = parse_config_lines("/etc/ssh/sshd_config:3:AllowUsers alice\n/etc/ssh/sshd_config:4:AllowUsers bob\n")
    assert str(blame({"allowusers": "alice bob"}, lines)["allowusers"]) == "/etc/ssh/sshd_config:3: AllowUsers alice"


@pytest.mark.skipif(not os.path.exists("/usr/sbin/sshd"), reason="needs sshd")
@pytest.mark.parametrize("who", ["nopasswd", "password"])
def test_the_login_section_reads_sshd_as_root_with_one_sudo(users, who):
    """sshd's files and `sshd -T` are read in ONE root shell: with passwordless sudo exactly as root reads them,
    one sudo asked; without, as the user (sshd -T then fails: its digest is the failure's), the same one sudo."""
    from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, counting_sudo

    kit = kit_over(converged_states(), Records())
    script = login_script(kit.cluster, "spark2", "sparkctl-spark-pair_ed25519")
    as_root = parse_login(subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout)
    user = NOPASSWD_USER if who == "nopasswd" else SUDO_USER
    with counting_sudo() as (path, sudo_calls):
        out = subprocess.run(["runuser", "-u", user, "--", "env", f"PATH={path}", "bash", "-c", script],
                             capture_output=True, text=True, timeout=60)
        asked = sudo_calls()
    login = parse_login(out.stdout)
    sshd = {k: v for k, v in login.items() if k.startswith("sshd ")}
    root_sshd = {k: v for k, v in as_root.items() if k.startswith("sshd ")}
    assert asked == ["-n sh"], asked
    assert sshd and set(sshd) == set(root_sshd)
    assert (sshd == root_sshd) is (who == "nopasswd"), (sshd, root_sshd)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_a_match_block_is_found_by_the_shell_as_grep_finds_one(tmp_path, shell):
    """sshd's digests are taken per source address where a Match block could tell them apart: the block is found by
    the shell's own read of the files (a `grep` was a process on every rerun), where grep found it, and nowhere
    else; under sh (the login state's) and bash (the root read's) alike."""
    from sparkctl.shipped import shipped_text

    lines = {"plain": "PermitRootLogin no\n#Match User x\nX11Forwarding matchless\n",
             "match": "PermitRootLogin no\n  MATCH\tAddress 10.0.0.0/8\n  PasswordAuthentication no\n",
             "last line, no newline": "PermitRootLogin no\nMatch User backup",
             "a bare word": "Match\n"}
    for name, config in lines.items():
        etc = tmp_path / name.replace(" ", "-").replace(",", "")
        (etc / "sshd_config.d").mkdir(parents=True)
        (etc / "sshd_config").write_text("Include /etc/ssh/sshd_config.d/*.conf\n")
        (etc / "sshd_config.d" / "60-test.conf").write_text(config)
        mount = f'mount --bind {shlex.quote(str(etc))} /etc/ssh && {shell} -c "$0" sh nvidia 22 10.1.1.1/10.1.1.2'
        out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", mount,
                              shipped_text("sshd-digest.sh")], capture_output=True, text=True, timeout=60).stdout
        grep = subprocess.run(["grep", "-qisE", r"^[[:space:]]*match[[:space:]]", str(etc / "sshd_config"),
                               str(etc / "sshd_config.d" / "60-test.conf")]).returncode == 0
        assert ("sshd 10.1.1.1 " in out) is grep and ("sshd * " in out) is not grep, (name, out)
        assert grep is (name in ("match", "last line, no newline")), name
