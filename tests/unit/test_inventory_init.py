"""`inventory init`: the inventory written from what the nodes report, and every assumption said aloud."""

from __future__ import annotations

import yaml

from sparkctl.errors import Unreachable
from sparkctl.inventory import load_inventory
from sparkctl.runs.inventory_init import describe_cluster, login_failures, ssh_section
from tests.taskkit import spark_facts


def doc(result):
    return yaml.safe_load(result.text)


def facts(name, **kw):
    f = spark_facts(name, **kw)
    f.hostname = name
    return f


def test_a_pair_on_port_1_is_written_as_such_and_loads(tmp_path):
    result = describe_cluster(["10.0.0.11", "10.0.0.12"], [facts("spark-a"), facts("spark-b")], cluster="home")
    assert result.problems == [] and result.assumptions == []
    d = doc(result)
    assert d["fabric"] == {"topology": "pair", "port": 1, "mtu": 9000}
    assert [n["name"] for n in d["nodes"]] == ["spark-a", "spark-b"]
    path = tmp_path / "inventory.yaml"
    path.write_text(result.text)
    assert load_inventory(path).topology == "pair"


def test_different_up_ports_mean_auto_and_say_so():
    result = describe_cluster(["a", "b"], [facts("s1", up_ports=(0,)), facts("s2", up_ports=(1,))])
    assert doc(result)["fabric"]["port"] == "auto"
    assert any("different Up ports" in a for a in result.assumptions)
    assert all(f"# assumed: {a}" in result.text for a in result.assumptions)


def test_three_nodes_with_both_ports_up_are_assumed_a_ring():
    result = describe_cluster(["a", "b", "c"], [facts(n, up_ports=(0, 1)) for n in ("x", "y", "z")])
    assert doc(result)["fabric"]["topology"] == "ring"
    assert any("ring" in a for a in result.assumptions)


def test_problems_are_reported_not_guessed():
    result = describe_cluster(["a", "b"], [facts("s1", user="nvidia"), facts("s2", user="alice", up_ports=())])
    assert any("username differs" in p for p in result.problems)
    assert any("no QSFP port is Up on b" in p for p in result.problems)


def test_the_controller_itself_is_marked_local():
    result = describe_cluster(["10.0.0.11", "10.0.0.12"], [facts("s1"), facts("s2")],
                              controller_addrs=frozenset({"10.0.0.11"}))
    assert doc(result)["nodes"][0] == {"name": "s1", "host": "10.0.0.11", "local": True}
    assert "local" not in doc(result)["nodes"][1]


def _lab_ring_132() -> list:
    """The lab ring cabled 1,3,2 as its lldpd reported it (real captures, tests/fixtures/lldp/)."""
    from pathlib import Path

    from sparkctl.facts.lldp import parse_lldp

    lldp = Path(__file__).resolve().parents[1] / "fixtures" / "lldp"
    out = []
    for i in (1, 2, 3):
        f = facts(f"spark{i}", up_ports=(0, 1))
        f.lldp = parse_lldp((lldp / f"ring3-order132.spark{i}.json").read_text())
        out.append(f)
    return out


def test_a_ring_is_written_in_the_order_lldp_sees_head_first(tmp_path):
    result = describe_cluster(["10.0.0.11", "10.0.0.12", "10.0.0.13"], _lab_ring_132())
    d = doc(result)
    assert d["fabric"]["topology"] == "ring"
    assert [(n["name"], n["host"]) for n in d["nodes"]] == [("spark1", "10.0.0.11"), ("spark3", "10.0.0.13"),
                                                             ("spark2", "10.0.0.12")]
    assert result.problems == [] and not any("ring" in a for a in result.assumptions)
    assert any("spark1 -> spark3 -> spark2" in line for line in result.seen)
    assert "# seen with LLDP: a ring, cabled in the order" in result.text
    path = tmp_path / "inventory.yaml"
    path.write_text(result.text)
    assert load_inventory(path).topology == "ring"


def test_a_pair_seen_by_lldp_is_not_an_assumption():
    from sparkctl.facts import Lldp, LldpNeighbor

    a, b = facts("s1", up_ports=(0,)), facts("s2", up_ports=(1,))
    a.lldp = Lldp("ok", neighbors=[LldpNeighbor("enp1s0f0np0", "s2", port_descr="enp1s0f1np1")])
    result = describe_cluster(["a", "b"], [a, b])
    assert doc(result)["fabric"]["topology"] == "pair" and doc(result)["fabric"]["port"] == "auto"
    assert result.seen == ["the two nodes are cabled to each other"]


def test_the_ssh_flags_become_the_inventory_ssh_section_and_it_loads(tmp_path):
    key, known = tmp_path / "id_lab", tmp_path / "known_hosts"
    section = ssh_section(str(key), str(known))
    assert section == {"identity_file": str(key), "known_hosts": str(known)}
    assert ssh_section(None, "~/.ssh/known_hosts") == {}
    result = describe_cluster(["10.0.0.11", "10.0.0.12"], [facts("s1"), facts("s2")], ssh=section)
    path = tmp_path / "inventory.yaml"
    path.write_text(result.text)
    inventory = load_inventory(path)
    assert inventory.ssh.identity_file == str(key) and inventory.ssh.known_hosts == str(known)
    assert inventory.ssh_target("s2").identity_file == str(key)


def test_relative_ssh_flags_are_written_absolute(tmp_path, monkeypatch):
    """bootstrap runs from anywhere: `--identity-file K --known-hosts F` must not be read from its folder."""
    monkeypatch.chdir(tmp_path)
    assert ssh_section("K", "F") == {"identity_file": str(tmp_path / "K"), "known_hosts": str(tmp_path / "F")}
    assert ssh_section("keys/../K", "./F")["identity_file"] == str(tmp_path / "K")
    assert ssh_section("~/.ssh/lab", "~/lab/known_hosts") == {"identity_file": "~/.ssh/lab",
                                                             "known_hosts": "~/lab/known_hosts"}


def test_every_host_that_cannot_be_logged_in_to_is_named_with_the_hint_of_its_cause():
    failed = login_failures(["10.0.0.11", "10.0.0.12", "10.0.0.13"], {
        "10.0.0.11": Unreachable("10.0.0.11: authentication failed for user nvidia: no key to offer", kind="auth"),
        "10.0.0.13": Unreachable("10.0.0.13: connection refused on port 22", hint="is sshd running?"),
    })
    assert failed.message == ("2 of 3 host(s) could not be logged in to; no inventory was written (10.0.0.12 logged "
                              "in: its host key is in ~/.ssh/known_hosts)")
    assert failed.details == ["10.0.0.11: authentication failed for user nvidia: no key to offer",
                              "10.0.0.13: connection refused on port 22"]
    assert "--identity-file" in failed.hint and failed.kind == "auth"
    refused = login_failures(["a"], {"a": Unreachable("a: connection refused on port 22", hint="is sshd running?")})
    assert refused.hint == "is sshd running?"


def test_init_names_every_host_that_failed_and_writes_nothing(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from sparkctl.cli.main import cli
    from sparkctl.runs import inventory_init

    def refuse(specs, **_options):
        return {}, {s.node: Unreachable(f"{s.node}: authentication failed for user nvidia: the node refused every "
                                        "key offered", kind="auth") for s in specs}

    monkeypatch.setattr(inventory_init, "connect_all", refuse)
    out = tmp_path / "inventory.yaml"
    result = CliRunner().invoke(cli, ["inventory", "init", "10.0.0.11", "10.0.0.12", "-o", str(out)])
    assert result.exit_code == 3, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == "sparkctl: error: 2 of 2 host(s) could not be logged in to; nothing was written"
    assert lines[1].startswith("  10.0.0.11: authentication failed") and lines[2].startswith("  10.0.0.12: ")
    assert "--identity-file" in lines[3] and not out.exists()
