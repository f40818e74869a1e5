"""network.forwarding on recorded facts: a relaying ring node gets forwarding (and loose rp_filter) on its fabric
twins only, kept in a sysctl.d file; a second check finds nothing; the file goes when the ring no longer relays;
`cluster down --network` restores the values it replaced."""

from __future__ import annotations

import subprocess

from sparkctl.plan import plan_cluster
from sparkctl.plan.paths import sysctl_path
from sparkctl.tasks.network.down import NetworkDown
from sparkctl.tasks.network.forwarding import ForwardingTask, restore_script
from tests.taskkit import inventory, make_kit, spark_facts

TWINS = ("enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1")
PATH = sysctl_path("spark-ring4")


def ring_kit(conf: dict[str, str] | None = None, files: dict[str, str] | None = None):
    inv = inventory("four-sparks-ring.yaml")
    facts = {}
    for name in ("spark1", "spark2", "spark3", "spark4"):
        f = spark_facts(name, up_ports=(0, 1))
        f.ipv4_conf = dict(conf or {"ip_forward": "0", **{f"{i}.forwarding": "0" for i in TWINS},
                                    **{f"{i}.rp_filter": "0" for i in TWINS}})
        f.sysctl_files = dict(files or {})
        facts[name] = f
    return make_kit(inv, facts), inv


def test_a_relaying_ring_node_gets_forwarding_on_its_twins_only_then_nothing_to_do():
    kit, inv = ring_kit()
    ctx = kit.node("spark1")
    changes = ForwardingTask().check(ctx)
    assert [c.summary for c in changes][0] == f"create {PATH}"
    assert "enp1s0f0np0 forwarding 0, want 1" in changes[1].summary
    ForwardingTask().apply(ctx, changes)
    put = next(c for c in kit.transport("spark1").calls if c.kind == "put")
    assert put.target == PATH and put.mode == 0o644 and put.owner == "root:root" and put.sudo
    for iface in TWINS:
        assert f"net/ipv4/conf/{iface}/forwarding = 1" in put.content
        assert f"net/ipv4/conf/{iface}/rp_filter = 2" in put.content
    assert "ip_forward" not in put.content and "enP7s7" not in put.content
    commands = [c.target for c in kit.transport("spark1").calls if c.kind == "run"]
    assert any("sysctl -q -p" in c for c in commands)
    # the values replaced are recorded once, for `cluster down --network`
    record = next(c for c in commands if "sysctl.orig" in c)
    assert "net/ipv4/conf/enp1s0f0np0/forwarding 0" in record and "[ -e" in record
    # converged: the file as planned, the live values loaded
    conf = {f"{i}.forwarding": "1" for i in TWINS} | {f"{i}.rp_filter": "2" for i in TWINS}
    kit, _ = ring_kit(conf, {PATH: plan_cluster(inv).nodes["spark1"].sysctl_file})
    assert ForwardingTask().check(kit.node("spark1")) == []


def test_a_ring_of_three_or_a_switch_has_no_file_and_a_leftover_one_goes():
    kit, _ = ring_kit()
    three = inventory("three-sparks-ring.yaml")
    kit.cluster.inventory = three
    kit.cluster.nodes.pop("spark4")
    assert ForwardingTask().check(kit.node("spark1")) == []
    leftover = sysctl_path("spark-ring")
    kit.node("spark1").facts().sysctl_files[leftover] = "net/ipv4/conf/enp1s0f0np0/forwarding = 1\n"
    changes = ForwardingTask().check(kit.node("spark1"))
    assert [c.summary for c in changes] == [f"remove {leftover} (this node no longer relays)"]
    ForwardingTask().apply(kit.node("spark1"), changes)
    removal = [c.target for c in kit.transport("spark1").calls if c.kind == "run"][-1]
    assert f"rm -f {leftover}" in removal and "sysctl.orig" in removal


def test_the_recorded_values_are_set_back(tmp_path):
    """restore_script, run for real against a stand-in /proc/sys tree."""
    record = tmp_path / "sysctl.orig"
    record.write_text("net/ipv4/conf/eth9/forwarding 0\nnet/ipv4/conf/eth9/rp_filter 1\n")
    proc = tmp_path / "proc" / "sys" / "net" / "ipv4" / "conf" / "eth9"
    proc.mkdir(parents=True)
    (proc / "forwarding").write_text("1\n")
    (proc / "rp_filter").write_text("2\n")
    script = restore_script(str(record)).replace("/proc/sys/", f"{tmp_path}/proc/sys/")
    subprocess.run(["sh", "-c", script], check=True)
    assert (proc / "forwarding").read_text() == "0\n" and (proc / "rp_filter").read_text() == "1\n"
    assert not record.exists()


def test_down_network_names_the_forwarding_it_undoes():
    kit, _ = ring_kit()
    ctx = kit.node("spark1")
    kit.transport("spark1").respond("original", "NDAtY3g3LnlhbWw= bmV0d29yazoge30K\n"
                                    "c3lzY3RsLm9yaWc= bmV0L2lwdjQvY29uZi9lbnAxczBmMG5wMC9mb3J3YXJkaW5nIDAK\n")
    changes = NetworkDown().check(ctx)
    assert "restore /etc/netplan/40-cx7.yaml" in changes[0].summary
    assert f"remove {PATH} and restore the forwarding settings" in changes[0].summary
    assert "sysctl.orig" not in changes[0].summary.replace("forwarding settings", "")


def test_a_ring_route_missing_on_the_node_is_drift_that_netplan_apply_repairs():
    from sparkctl.facts import Route
    from sparkctl.tasks.network.netplan import missing_routes

    kit, inv = ring_kit()
    ctx = kit.node("spark1")
    planned = plan_cluster(inv).nodes["spark1"].routes
    ctx.facts().routes = [Route(to.removesuffix("/32"), via, iface) for iface, routes in planned.items()
                          for to, via in routes]
    assert missing_routes(ctx) == []
    gone = ctx.facts().routes.pop(0)
    assert missing_routes(ctx) == [(gone.device, gone.destination + "/32", gone.via)]
