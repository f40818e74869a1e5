"""sparkctl's firewall: the inventory's firewall section checked by what each value is, the rules each node gets
(nft itself checks them where the test command installed it), the task's check judging file, live table and boot
unit, a load armed with a revert and confirmed over a new connection, `firewall: off` and `cluster down`."""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.facts import parse
from sparkctl.facts.firewall_files import LISTED_PATH, RULES_PATH, UNIT_PATH
from sparkctl.inventory import load_inventory
from sparkctl.plan.firewall import firewall_spec
from sparkctl.tasks.network.firewall import FirewallRemoveTask, FirewallTask, listing_hash
from sparkctl.tasks.network.firewall_guard import guard_script
from tests.taskkit import inventory_from_yaml, make_kit, spark_facts
from tests.unit.inventory_kit import PAIR, only_problem

SERVING = PAIR + "serve: {preset: qwen3-235b-eagle3}\n"


def _spec(tmp_path, extra: str = "", node: str = "spark1"):
    inv = inventory_from_yaml(SERVING + extra, tmp_path)
    kit = make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    return firewall_spec(inv, node, kit.cluster.plan().fabric, serving=True), inv


# --- the inventory ------------------------------------------------------------------------------------------

def test_on_by_default_and_off_is_said_on_every_run_at_its_line(inv_file):
    assert load_inventory(inv_file(PAIR)).firewall.allow == []
    off = load_inventory(inv_file(PAIR + "firewall: off\n"))
    assert off.firewall == "off"
    assert off.warnings == ["inv.yaml:7: firewall: off: the nodes' own rules are left alone, and what the engines, "
                            "Open MPI and Ray listen on answers on the management network too (remove "
                            "`firewall: off` to let sparkctl close it: docs/firewall.md)"]


def test_allowed_ports_are_read_by_what_they_are(inv_file):
    inv = load_inventory(inv_file(PAIR + "firewall: {allow: [8080, 5353/udp, 9100-9110/tcp, '443']}\n"))
    assert inv.firewall.allow == ["8080/tcp", "5353/udp", "9100-9110/tcp", "443/tcp"]
    for bad, said in (("80/icmp", "not a port to let in"), ("0", "ports are 1 to 65535"),
                      ("70000", "ports are 1 to 65535"), ("90-80", "the first of a range not above the last"),
                      ("true", "not true/false"), ("'22; drop'", "not a port to let in")):
        problem = only_problem(inv_file(PAIR + f"firewall: {{allow: [{bad}]}}\n"))
        assert problem.startswith("inv.yaml:7: firewall.allow[0]: ") and said in problem, problem


def test_ssh_sources_are_networks_and_allow_does_not_undo_them(inv_file):
    inv = load_inventory(inv_file(PAIR + "firewall: {ssh_from: [10.0.0.0/24, 10.9.9.9, 'fd00::/64']}\n"))
    assert inv.firewall.ssh_from == ["10.0.0.0/24", "10.9.9.9/32", "fd00::/64"]
    assert "has host bits set (did you mean 10.0.0.0/8?)" in only_problem(
        inv_file(PAIR + "firewall: {ssh_from: [10.0.0.1/8]}\n"))
    assert "not a network or address" in only_problem(inv_file(PAIR + "firewall: {ssh_from: [anywhere]}\n"))
    assert "not a network or address" in only_problem(inv_file(PAIR + "firewall: {ssh_from: ['fe80::1%eth0']}\n"))
    both = load_inventory(inv_file(PAIR + "firewall: {ssh_from: [10.0.0.0/24], allow: [20-30]}\n"))
    assert both.warnings == ["inv.yaml:7: firewall.allow[0]: lets sshd's port 22 in from anywhere, so "
                             "firewall.ssh_from narrows nothing (remove it from allow)"]


# --- the rules ----------------------------------------------------------------------------------------------

def test_the_head_lets_in_sshd_and_the_endpoint_a_worker_sshd_and_the_fabric_keeps_everything(tmp_path):
    head, _ = _spec(tmp_path)
    worker, _ = _spec(tmp_path, node="spark2")
    rules = head.rules()
    assert "type filter hook input priority filter + 10; policy drop;" in rules
    assert 'iifname { "enp1s0f1np1", "enP2p1s0f1np1" } accept' in rules
    assert "ct state established,related accept" in rules and 'iifname "lo" accept' in rules
    assert "tcp dport 22 accept" in rules and "tcp dport 8355 accept" in rules
    assert "8355" not in worker.rules() and "tcp dport 22 accept" in worker.rules()
    assert head.summary() == "sshd :22, 8355/tcp" and worker.summary() == "sshd :22"


def test_allow_and_ssh_sources_become_rules_of_their_family(tmp_path):
    spec, _ = _spec(tmp_path, "firewall: {allow: [9100-9110, 5353/udp], ssh_from: [10.1.0.0/16, 'fd00::/64']}\n")
    rules = spec.rules()
    assert "tcp dport 22 ip saddr { 10.1.0.0/16 } accept" in rules
    assert "tcp dport 22 ip6 saddr { fd00::/64 } accept" in rules and "tcp dport 22 accept" not in rules
    assert "tcp dport 9100-9110 accept" in rules and "udp dport 5353 accept" in rules


@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is installed by scripts/test")
def test_nft_reads_the_rules_as_written(tmp_path):
    spec, _ = _spec(tmp_path, "firewall: {allow: [9100-9110, 5353/udp], ssh_from: [10.1.0.0/16, 'fd00::/64']}\n")
    path = tmp_path / "firewall.nft"
    path.write_text(spec.rules())
    checked = subprocess.run(["unshare", "--net", "nft", "-c", "-f", str(path)], capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stderr


# --- the facts ----------------------------------------------------------------------------------------------

RULESET = """table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
}
table inet sparkctl {
	chain input {
		type filter hook input priority filter + 10; policy drop;
		tcp dport 22 accept
	}
}
"""


def test_sparkctl_s_own_table_is_read_apart_and_is_no_firewall_of_the_node_s():
    table = parse.own_table(RULESET)
    assert table is not None and table.startswith("table inet sparkctl {") and table.endswith("}\n")
    assert "INPUT" not in table
    assert parse.parse_firewall(f"#nft\n{RULESET}") is None  # preflight does not warn of sparkctl's own rules
    assert parse.own_table("table ip filter {\n}\n") == ""
    assert parse.own_table("Error: Operation not permitted\n") is None


# --- the task -----------------------------------------------------------------------------------------------

def _kit(tmp_path, extra: str = "", **facts_of):
    inv = inventory_from_yaml(SERVING + extra, tmp_path)
    facts = {n.name: spark_facts(n.name) for n in inv.nodes}
    for node, values in facts_of.items():
        for key, value in values.items():
            setattr(facts[node], key, value)
    kit = make_kit(inv, facts)
    kit.fresh_rules.append((r"touch .*/confirmed", "confirmed\n", 0))
    return kit


def _as_planned(kit, node: str) -> dict:
    spec = firewall_spec(kit.cluster.inventory, node, kit.cluster.plan().fabric, serving=True)
    live = "table inet sparkctl {\n\tchain input {\n\t}\n}\n"
    return {"firewall_rules": spec.rules(), "own_firewall": live, "firewall_listed": listing_hash(live),
            "firewall_unit": spec.unit(), "firewall_unit_enabled": "enabled"}


def test_a_node_without_it_gets_rules_and_unit_and_one_as_planned_is_left_alone(tmp_path):
    kit = _kit(tmp_path, spark1={"own_firewall": ""})
    changes = FirewallTask().check(kit.node("spark1"))
    assert [c.payload for c in changes] == ["load", "unit"]
    assert changes[0].summary == "load the firewall: on the management side only sshd :22, 8355/tcp"
    planned = _as_planned(_kit(tmp_path), "spark1")
    assert FirewallTask().check(_kit(tmp_path, spark1=planned).node("spark1")) == []


def test_drift_in_the_live_table_or_the_unit_is_found(tmp_path):
    planned = _as_planned(_kit(tmp_path), "spark1")
    edited = dict(planned, own_firewall="table inet sparkctl {\n\tchain input {\n\t\ttcp dport 1024 accept\n\t}\n}\n")
    changes = FirewallTask().check(_kit(tmp_path, spark1=edited).node("spark1"))
    assert [c.summary for c in changes] == ["load the firewall again: the table inet sparkctl differs from the one "
                                            "sparkctl loaded"]
    flushed = dict(planned, own_firewall="")
    assert [c.payload for c in FirewallTask().check(_kit(tmp_path, spark1=flushed).node("spark1"))] == ["load"]
    disabled = dict(planned, firewall_unit_enabled="disabled")
    assert [c.payload for c in FirewallTask().check(_kit(tmp_path, spark1=disabled).node("spark1"))] == ["unit"]


def test_facts_without_sudo_are_read_again_with_it(tmp_path):
    planned = _as_planned(_kit(tmp_path), "spark1")
    kit = _kit(tmp_path, spark1=dict(planned, own_firewall=None))
    kit.transport("spark1").respond(r"nft list ruleset", "table inet sparkctl {\n\tchain input {\n\t}\n}\n")
    assert FirewallTask().check(kit.node("spark1")) == []
    assert any(c.sudo and c.target.endswith("; nft list ruleset") for c in kit.transport("spark1").calls)


def test_a_load_is_checked_armed_loaded_confirmed_over_a_new_connection_then_recorded(tmp_path):
    kit = _kit(tmp_path, spark1={"own_firewall": ""})
    transport = kit.transport("spark1")
    transport.respond(r"^nft list table inet sparkctl", "table inet sparkctl {\n}\n")
    task = FirewallTask()
    task.apply(kit.node("spark1"), task.check(kit.node("spark1")))
    runs = [c.target for c in transport.calls if c.kind == "run"]
    order = [next(i for i, r in enumerate(runs) if r.startswith(prefix)) for prefix in
             ("nft -c -f", "set -e", "if nft -f")]
    assert order == sorted(order), runs  # checked, then armed, then loaded
    assert "systemd-run --quiet --collect" in runs[order[1]] and "kill -0" in runs[order[1]]
    assert any("touch" in c.target and "/confirmed" in c.target for f in kit.fresh for c in f.calls)
    puts = {c.target: c for c in transport.calls if c.kind == "put"}
    assert puts[LISTED_PATH].content == hashlib.sha256(b"table inet sparkctl {\n}\n").hexdigest() + "\n"
    assert puts[RULES_PATH + ".new"].mode == 0o644 and UNIT_PATH in puts
    assert "systemctl daemon-reload && systemctl enable sparkctl-firewall.service" in runs


def test_a_load_that_cuts_the_new_connection_fails_saying_the_node_puts_its_rules_back(tmp_path):
    kit = _kit(tmp_path, spark1={"own_firewall": ""})
    kit.refuse_fresh = True
    task = FirewallTask()
    with pytest.raises(Exception) as failed:
        task.apply(kit.node("spark1"), task.check(kit.node("spark1")))
    assert "could not be reached over a new management connection" in str(failed.value)
    assert "puts its previous firewall back by itself" in str(failed.value)
    assert "firewall.ssh_from" in failed.value.hint


def test_off_removes_sparkctl_s_table_and_nothing_else_and_down_removes_it_too(tmp_path):
    kit = _kit(tmp_path, "firewall: off\n", spark1={"own_firewall": "table inet sparkctl {\n}\n"})
    changes = FirewallTask().check(kit.node("spark1"))
    assert [c.payload for c in changes] == ["remove"]
    FirewallTask().apply(kit.node("spark1"), changes)
    removed = [c.target for c in kit.transport("spark1").calls if c.kind == "run"][-1]
    assert removed.startswith("nft delete table inet sparkctl 2>/dev/null;") and "flush ruleset" not in removed
    assert FirewallTask().check(_kit(tmp_path, "firewall: off\n", spark1={"own_firewall": ""}).node("spark1")) == []
    down = _kit(tmp_path, spark2={"own_firewall": "", "firewall_rules": "x"})
    assert [c.payload for c in FirewallRemoveTask().check(down.node("spark2"))] == ["remove"]


def test_the_guard_puts_back_the_table_and_the_files_it_kept(tmp_path):
    script = guard_script("17", 60)
    assert script.startswith("#!/bin/sh\n")
    assert "nft -f /etc/sparkctl/guard/17/table.kept" in script and "sleep 60" in script
    # the new rules replace the old file only once confirmed: a guard that reverts drops them
    assert "rm -f /etc/sparkctl/firewall.nft.new" in script and "flock 9" in script
    assert Path(RULES_PATH).parent.as_posix() == "/etc/sparkctl"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("systemctl"),
                    reason="needs root for a mount namespace, and systemctl")
def test_the_facts_say_the_unit_is_enabled_as_systemctl_does_and_ask_it_only_off_the_plain_case(tmp_path):
    """The link `systemctl enable` makes, leading to the unit's file with nothing in /run standing in for it, is
    read as "enabled" by the shell (`systemctl` was a process on every rerun); every other case is asked, and each
    answer is the one `systemctl is-enabled` gives (here without a manager: `--root=/` reads the unit files)."""
    from sparkctl.facts.firewall_files import UNIT_NAME, WANTS_PATH
    from sparkctl.facts.sections import FIREWALL_FILES_CALL
    from sparkctl.shipped import shipped_text

    unit = _spec(tmp_path)[0].unit()
    cases = {  # what systemctl says of each (a runtime mask: "masked-runtime" from the manager; not read offline)
        "enabled": (f"ln -s {UNIT_PATH} {WANTS_PATH}", "enabled"),
        "disabled": ("true", "disabled"),
        "runtime mask": (f"ln -s {UNIT_PATH} {WANTS_PATH}; ln -s /dev/null /run/systemd/system/{UNIT_NAME}",
                         None),
        "a link to another file": (f"cp {UNIT_PATH} /etc/other.service; ln -s /etc/other.service {WANTS_PATH}",
                                   None),
    }
    stub = 'systemctl() { echo asked >> "$ASKED"; command systemctl --root=/ "$@"; }'
    facts = f'{shipped_text("facts.sh")}\n_print() {{ cat "$1"; }}\n{stub}\n{FIREWALL_FILES_CALL}'
    asked = tmp_path / "asked"
    for name, (setup, expected) in cases.items():
        asked.unlink(missing_ok=True)
        prepare = ("mount -t tmpfs none /etc/systemd/system && mkdir -p /run/systemd && "
                   "mount -t tmpfs none /run/systemd && "
                   f"mkdir -p /run/systemd/system {posixpath.dirname(WANTS_PATH)} && "
                   f"printf '%s' {shlex.quote(unit)} > {UNIT_PATH} && {setup}")
        read = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                               f'{prepare} && bash -c "$0" && echo "#systemctl" && '
                               f"(systemctl --root=/ is-enabled {UNIT_NAME} || true)", facts],
                              capture_output=True, text=True, timeout=60, env={**os.environ, "ASKED": str(asked)})
        said, _, systemd = read.stdout.partition("#systemctl\n")
        enabled = said.split("#enabled\n")[-1]
        assert enabled == systemd and enabled.strip(), (name, read.stdout, read.stderr)
        assert expected is None or enabled == f"{expected}\n", (name, enabled)
        assert asked.exists() is (name != "enabled"), name
