"""The doctor's checks of the nodes' own software (issue 13, section 4): parsers on real outputs (tests/fixtures/roce/,
tests/fixtures/facts/meminfo.txt), and each check's fault on the healthy two-Spark snapshot of test_doctor_checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sparkctl.doctor.node_probes import (
    Setting,
    parse_gids,
    parse_ibv_devinfo,
    parse_settings,
    parse_sshd_dropins,
    parse_versions,
)
from sparkctl.knowledge.cuda import driver_problem
from tests.unit.doctor_snapshot_kit import (
    ADDRS,
    GiB_KB,
    diagnose,
    healthy_snapshot,
    set_meminfo,
    with_system_probes,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_ibv_devinfo_of_a_real_spark():
    hcas = parse_ibv_devinfo((FIXTURES / "roce" / "ibv_devinfo.spark.txt").read_text())
    assert {d: (h.fw, h.state, h.link_layer) for d, h in hcas.items()} == {
        "rocep1s0f0": ("28.45.4028", "PORT_DOWN", "Ethernet"), "rocep1s0f1": ("28.45.4028", "PORT_ACTIVE", "Ethernet"),
        "roceP2p1s0f0": ("28.45.4028", "PORT_DOWN", "Ethernet"),
        "roceP2p1s0f1": ("28.45.4028", "PORT_ACTIVE", "Ethernet")}
    assert parse_ibv_devinfo("#absent\n") is None


def test_show_gids_rows_with_and_without_an_ipv4():
    gids = parse_gids((FIXTURES / "roce" / "show_gids.mlx5.txt").read_text())
    assert [(g.index, g.version, g.ipv4, g.netdev) for g in gids] == [
        (0, "v1", None, "rdma0"), (1, "v2", None, "rdma0"), (2, "v1", "192.168.211.242", "rdma0"),
        (3, "v2", "192.168.211.242", "rdma0")]
    # the sysfs fallback prints the kernel's type ("RoCE v2") in the VER column
    (row,) = parse_gids("rocep1s0f1\t1\t3\t0000:0000:0000:0000:0000:ffff:c0a8:640a\t\tRoCE v2\tenp1s0f1np1\n")
    assert (row.version, row.ipv4) == ("v2", "192.168.100.10")
    assert parse_gids("#absent") is None


def test_versions_settings_and_sshd_lines():
    assert parse_versions("kernel 6.11.0-1016-nvidia\ndriver 580.95.05\ncuda 13.0\n") == {
        "kernel": "6.11.0-1016-nvidia", "driver": "580.95.05", "cuda": "13.0"}
    assert parse_settings("/home/nvidia/.bashrc:12:export NCCL_SOCKET_IFNAME='eth0'\n/etc/nccl.conf:1:NCCL_IB_DISABLE=1"
                          ) == [Setting("/home/nvidia/.bashrc", 12, "NCCL_SOCKET_IFNAME", "eth0"),
                                Setting("/etc/nccl.conf", 1, "NCCL_IB_DISABLE", "1")]
    assert parse_sshd_dropins("/etc/ssh/sshd_config.d/50-x.conf:pubkeyauthentication no\n") == [
        ("/etc/ssh/sshd_config.d/50-x.conf", "PubkeyAuthentication", "no")]


def test_the_driver_against_the_image_cuda():
    assert driver_problem("580.95.05", "13.0", "13.0.2") is None
    assert driver_problem("575.64.03", "12.9", "13.0.2")[0] == "error"
    assert driver_problem("580.95.05", "13.0", "13.1.0")[0] == "warning"
    assert driver_problem("580.95.05", "13.0", "") is None


def healthy():
    """The healthy snapshot with what the new probes see on a healthy pair."""
    return with_system_probes(healthy_snapshot())


def ids(s) -> set[tuple[str, str, str]]:
    return {(f.id, f.node, f.severity) for f in diagnose(s).findings}


def test_the_healthy_pair_stays_silent():
    assert ids(healthy()) == set()


def test_a_missing_rocev2_gid_and_an_inactive_port():
    s = healthy()
    s.probes["spark2"].system.gids = [g for g in s.probes["spark2"].system.gids if g.device != "roceP2p1s0f1"]
    s.probes["spark1"].system.hcas["rocep1s0f1"].state = "PORT_DOWN"
    d = diagnose(s)
    assert {(f.id, f.node) for f in d.errors} == {("roce.gid_missing", "spark2"), ("roce.port_inactive", "spark1")}
    gid = next(f for f in d.errors if f.id == "roce.gid_missing")
    assert "192.168.101.11" in gid.summary and "roceP2p1s0f1" in gid.summary


def test_driver_kernel_and_firmware_differ_between_nodes():
    s = healthy()
    system = s.probes["spark2"].system
    system.driver, system.kernel = "575.64.03", "6.8.0-1010-nvidia"
    for hca in system.hcas.values():
        hca.fw = "28.43.1014"
    found = ids(s)
    assert {("gpu.driver_mismatch", "spark2", "error"), ("node.kernel_mismatch", "spark2", "warning"),
            ("roce.firmware_mismatch", "spark2", "error")} <= found
    assert not any(node == "spark1" for _, node, _ in found)


def test_a_driver_too_old_for_the_images_cuda():
    s = healthy()
    for node in ADDRS:
        s.facts[node].containers["trtllm-multinode"].env["CUDA_VERSION"] = "13.0.2"
    s.probes["spark1"].system.driver, s.probes["spark1"].system.cuda = "570.133.20", "12.8"
    assert ("gpu.driver_too_old", "spark1", "error") in ids(s)


def test_settings_that_override_sparkctls():
    s = healthy()
    s.facts["spark1"].containers["trtllm-multinode"].env["NCCL_IB_DISABLE"] = "1"  # from the image
    s.probes["spark2"].system.container_settings = [Setting("/etc/nccl.conf", 3, "NCCL_NET", "Socket"),
                                                    Setting("/etc/nccl.conf", 4, "NCCL_SOCKET_IFNAME", "eth0")]
    s.probes["spark2"].system.host_settings = [Setting("/home/nvidia/.bashrc", 9, "NCCL_IB_HCA", "mlx5_0")]
    found = ids(s)
    assert ("env.image_setting", "spark1", "error") in found
    assert ("env.file_setting", "spark2", "error") in found  # NCCL_NET=Socket
    # nccl.conf loses to the environment sparkctl sets: NCCL_SOCKET_IFNAME there changes nothing
    assert not [f for f in diagnose(s).findings if "NCCL_SOCKET_IFNAME" in f.summary]
    assert ("env.host_setting", "spark2", "warning") in found


def test_sshd_dropins_that_break_the_mesh():
    s = healthy()
    s.probes["spark2"].system.sshd_dropins = [
        ("/etc/ssh/sshd_config.d/10-hardening.conf", "PubkeyAuthentication", "no"),
        ("/etc/ssh/sshd_config.d/20-users.conf", "AllowUsers", "admin ubuntu@10.0.0.*"),
        ("/etc/ssh/sshd_config.d/30-later.conf", "PubkeyAuthentication", "yes")]
    found = [f for f in diagnose(s).errors if f.id == "ssh.sshd_dropin"]
    assert [(f.node, f.evidence.split(" in ")[0]) for f in found] == [
        ("spark2", "PubkeyAuthentication no"), ("spark2", "AllowUsers admin ubuntu@10.0.0.*")]
    s.probes["spark2"].system.sshd_dropins = [("/etc/ssh/sshd_config.d/20-users.conf", "AllowUsers", "nvidia admin")]
    assert not [f for f in diagnose(s).findings if f.id == "ssh.sshd_dropin"]


def test_memory_for_the_model_page_cache_cma_and_swap():
    s = healthy()
    s.probes["spark1"].health_status = 0  # the model is not loaded yet
    # Qwen3-235B at TP=2: ~71.5 GB per node; 120 GiB in all, 40 GiB free, 70 GiB of page cache
    set_meminfo(s, "spark1", MemTotal=120 * GiB_KB, MemFree=40 * GiB_KB, Cached=70 * GiB_KB)
    set_meminfo(s, "spark2", MemTotal=120 * GiB_KB, MemFree=100 * GiB_KB, CmaTotal=60 * GiB_KB, CmaFree=59 * GiB_KB,
             SwapTotal=8 * GiB_KB, SwapFree=2 * GiB_KB, SwapCached=0)
    found = ids(s)
    assert {("node.page_cache", "spark1", "warning"), ("node.cma_reserved", "spark2", "warning"),
            ("node.swap_in_use", "spark2", "warning")} <= found
    cache = next(f for f in diagnose(s).findings if f.id == "node.page_cache" and f.node == "spark1")
    assert "drop_caches" in cache.fix and "the model needs 71.5 GB" in cache.evidence


def test_a_loaded_model_is_not_blamed_on_the_page_cache():
    s = healthy()
    set_meminfo(s, "spark1", MemTotal=120 * GiB_KB, MemFree=10 * GiB_KB, Cached=8 * GiB_KB)
    assert s.probes["spark1"].health_status == 200
    assert not [f for f in diagnose(s).findings if f.id == "node.page_cache"]


def test_single_facts_field_defaults_keep_old_snapshots_silent():
    s = healthy_snapshot()
    assert all(dataclasses.asdict(s.probes[n].system)["hcas"] is None for n in ADDRS)
    assert diagnose(s).findings == []


def test_a_roce_port_down_because_the_far_end_is_set_down_is_said_once_on_that_end():
    """Both twins of spark2 set down: spark1's RoCE ports go down with the link (mlx5 follows the carrier); the one
    finding is spark2's port, never a RoCE fault on spark1 (a lab seed found spark1's netdev read as Up while its
    RoCE port already said PORT_DOWN)."""
    s = healthy()
    for twin in ("enp1s0f1np1", "enP2p1s0f1np1"):
        s.facts["spark2"].interfaces[twin].operstate = "DOWN"
        s.facts["spark2"].interfaces[twin].flags = ["BROADCAST", "MULTICAST"]
    for hca in s.probes["spark1"].system.hcas.values():
        hca.state = "PORT_DOWN"
    assert ids(s) == {("fabric.port_down", "spark2", "error")}
