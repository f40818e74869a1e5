"""Fact parsers against real command output (tests/fixtures/facts/README.md says which is real)."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.facts import Facts, Interface, RoceDevice, facts_from_output, gather_facts
from sparkctl.facts import parse as p
from sparkctl.facts.script import render_script
from sparkctl.secrets import MASK
from sparkctl.transport.base import CommandResult
from sparkctl.transport.framing import Framing

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "facts"
HOSTILE = "it's; rm -rf /"
CAPTURE_ARGS = dict(container_names=["trtllm-multinode", HOSTILE],
                    image_refs=["nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"])


def fixture(name: str) -> str:
    return (FIX / name).read_text()


def captured(name: str, **kw) -> Facts:
    return facts_from_output(fixture(name), "fixture", "spark1", **CAPTURE_ARGS, **kw)


# --- single parsers, real output

def test_ip_addr_netns_twins_mtu_addresses_and_down_port():
    ifs = p.parse_ip_addr(fixture("ip-addr.netns.json"))
    assert set(ifs) == {"lo", "enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP7s7"}
    twin1, twin2, down = ifs["enp1s0f1np1"], ifs["enP2p1s0f1np1"], ifs["enp1s0f0np0"]
    assert (twin1.mtu, twin2.mtu, down.mtu) == (9000, 9000, 1500)
    assert [str(a) for a in twin1.ipv4()] == ["192.168.100.10/24"]
    assert str(twin2.ipv4()[0].network) == "192.168.101.0/24"
    assert twin1.up and twin2.up and not down.up
    assert down.operstate == "DOWN" and down.carrier is None
    assert any(a.is_link_local and a.family == "inet6" for a in twin1.addresses)
    assert ifs["lo"].operstate == "UNKNOWN" and ifs["lo"].up  # UNKNOWN with carrier counts as Up


def test_operstate_up_without_carrier_is_not_up():
    """`ip -j addr` read between the kernel dropping the carrier and linkwatch moving operstate."""
    early = '[{"ifname": "enp1s0f1np1", "mtu": 9000, "operstate": "UP", "flags": ["BROADCAST", "MULTICAST", "UP"]}]'
    nic = p.parse_ip_addr(early)["enp1s0f1np1"]
    assert nic.carrier is False and not nic.up and not nic.admin_down


def test_ip_addr_host():
    ifs = p.parse_ip_addr(fixture("ip-addr.host.json"))
    assert ifs["lo"].addresses[0].scope == "host"
    assert not ifs["ifb0"].up


def test_meminfo_df_os_release():
    mem = p.parse_meminfo(fixture("meminfo.txt"))
    assert mem["MemTotal"] > mem["MemAvailable"] > 0 and "Cached" in mem
    assert int(fixture("df.txt").splitlines()[1]) > 0
    osr = p.parse_key_values(fixture("os-release.debian12.txt"))
    assert (osr["ID"], osr["VERSION_ID"]) == ("debian", "12")
    assert osr["PRETTY_NAME"] == "Debian GNU/Linux 12 (bookworm)"
    assert p.parse_key_values(fixture("os-release.dgxos.handmade.txt"))["VERSION_ID"] == "24.04"


def test_ss_listening_with_and_without_process_names():
    assert p.parse_ss_listening(fixture("ss.netns.txt")) == {18355: "python3"}
    assert p.parse_ss_listening(fixture("ss.host.txt")) == {2024: None}
    assert p.parse_ss_listening('LISTEN 0 128 [::]:2233 [::]:* users:(("sshd",pid=9,fd=4))\n'
                                "LISTEN 0 128 127.0.0.53%lo:53 0.0.0.0:*\n") == {2233: "sshd", 53: None}


def test_ss_listening_addresses_by_port():
    assert p.parse_ss_addresses(fixture("ss.netns.txt")) == {18355: ["127.0.0.1"]}
    assert p.parse_ss_addresses('LISTEN 0 128 [::]:2233 [::]:* users:(("sshd",pid=9,fd=4))\n'
                                "LISTEN 0 128 192.168.100.10:2233 0.0.0.0:*\n"
                                "LISTEN 0 128 127.0.0.53%lo:53 0.0.0.0:*\n"
                                "LISTEN 0 128 *:22 *:*\n") == {2233: ["::", "192.168.100.10"], 53: ["127.0.0.53"],
                                                              22: ["*"]}


def test_ibdev2netdev_spark_lines():
    roce = p.parse_ibdev2netdev(fixture("ibdev2netdev.spark.handmade.txt"))
    assert [(d.device, d.port, d.netdev, d.up) for d in roce] == [
        ("rocep1s0f0", 1, "enp1s0f0np0", False), ("roceP2p1s0f0", 1, "enP2p1s0f0np0", False),
        ("rocep1s0f1", 1, "enp1s0f1np1", True), ("roceP2p1s0f1", 1, "enP2p1s0f1np1", True)]


def test_dgx_release():
    assert p.parse_key_values(fixture("dgx-release.spark.handmade.txt"))["DGX_NAME"] == "DGX Spark"


def test_docker_inspect_real_podman_output_redacts_secrets():
    info = p.parse_docker_answer(fixture("docker-inspect.podman-created.json"), ["sfx-facts-test", "nope"],
                                 []).containers
    c = info["sfx-facts-test"]
    assert c.exists and not c.running and c.status == "created" and c.started_at is None
    # podman's bare hex, written as docker writes an id
    assert c.image == "localhost/sfx-scratch:facts" and c.image_id.startswith("sha256:3a23e68e")
    assert c.labels == {"org.sparkctl.spec": "abc123"}
    assert c.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
    assert c.env["HF_TOKEN"] == MASK and "not-a-real-token" not in repr(c)
    assert c.mounts[0]["Destination"] == "/root/.cache/huggingface" and c.mounts[0]["RW"] is False
    assert not info["nope"].exists and info["nope"].status == "absent"
    assert c.restart_policy == "no"  # podman writes "" for none, docker "no": the same to sparkctl


def test_a_container_s_restart_policy_is_read_as_docker_names_it():
    item = {"Name": "/c", "Id": "1", "State": {"Status": "running", "Running": True}, "Config": {}}
    for host_config, policy in (({"RestartPolicy": {"Name": "unless-stopped", "MaximumRetryCount": 0}},
                                 "unless-stopped"), ({"RestartPolicy": {"Name": "no"}}, "no"), ({}, None)):
        answer = p.parse_docker_answer(json.dumps([dict(item, HostConfig=host_config)]), ["c"], [])
        assert answer.containers["c"].restart_policy == policy


def test_one_docker_inspect_answers_for_the_container_and_the_image():
    """The gather script asks docker once (container and image together): real podman output of both."""
    ref = "localhost/sparkctl-lab-trtllm:1.3.0rc12"
    answer = p.parse_docker_answer(fixture("docker-inspect.podman-container-and-image.json")
                                   + '#err Error: inspecting object: no such object: "nvcr.io/x:1"',
                                   ["trtllm-multinode"], [ref, "nvcr.io/x:1"])
    assert answer.reached and answer.error is None
    c = answer.containers["trtllm-multinode"]
    assert c.exists and c.running and c.id and c.image == ref and c.env["OMPI_MCA_btl_tcp_if_include"]
    assert answer.images[ref].startswith("sha256:6e62f1ae") and answer.images["nvcr.io/x:1"] is None
    # a socket that refuses us, or no daemon: docker was not reached, nothing is "absent"
    denied = p.parse_docker_answer("[]\n#err permission denied while trying to connect to the Docker daemon socket "
                                   "at unix:///var/run/docker.sock", ["trtllm-multinode"], [ref])
    assert not denied.reached and denied.error.startswith("permission denied")
    assert denied.containers["trtllm-multinode"].status == "unknown"
    # docker.io short names match the library spelling podman reports
    hub = '[{"Id": "abc", "RepoTags": ["docker.io/library/ubuntu:24.04"]}]'
    assert p.parse_docker_answer(hub, [], ["ubuntu:24.04", "x:1"]).images == {"ubuntu:24.04": "abc", "x:1": None}


def test_firewall_summaries():
    assert p.parse_firewall(fixture("ufw-status.handmade.txt")) == "ufw active"
    assert p.parse_firewall("#iptables\n-P INPUT ACCEPT\n") is None
    assert p.parse_firewall("#iptables\n-P INPUT DROP\n-A INPUT -p tcp --dport 22 -j ACCEPT\n") == \
        "iptables: INPUT policy DROP, 1 rules"
    accept_only = ("#nft\ntable inet f {\n chain input {\n"
                   "  type filter hook input priority 0; policy accept;\n }\n}\n")
    assert p.parse_firewall(accept_only) is None


# --- the whole script's output, real captures

def test_gather_netns_as_root():
    f = captured("gather.netns-root.txt")
    assert f.raw_errors == []
    assert (f.os_id, f.os_version, f.user, f.uid, f.sudo_nopasswd) == ("debian", "12", "root", 0, True)
    assert f.session_ip == "10.201.0.11" and f.management_interfaces == ["enP7s7"]
    assert f.ports() == {0: ["enp1s0f0np0"], 1: ["enp1s0f1np1", "enP2p1s0f1np1"]}
    assert f.up_ports() == {1: ["enp1s0f1np1", "enP2p1s0f1np1"]}
    assert f.interfaces["enp1s0f1np1"].speed_mbps == 10000 and f.interfaces["enp1s0f0np0"].speed_mbps is None
    cx7 = next(n for n in f.netplan_files if n.path == "/etc/netplan/40-cx7.yaml")
    assert cx7.mode == 0o600 and "192.168.100.10/24" in cx7.content
    assert "@@sparkctl:fixture:end netplan 0@@" in cx7.content  # a forged marker inside a file stays content
    assert f.firewall == "nftables: 3 rules in input (policy drop)"
    assert f.listening_tcp == {18355: "python3"}
    assert f.hf_cache == "/root/.cache/huggingface" and f.hf_cache_free_bytes > 0
    assert f.docker_cli and not f.docker_access and "Cannot connect" in f.docker_error
    assert f.containers[HOSTILE].status == "unknown"
    assert f.time > 1.7e9 and f.mem_total_kb > 0 and f.page_cache_kb > 0


def test_gather_netns_as_unprivileged_user():
    f = captured("gather.netns-nobody.txt")
    assert f.raw_errors == []
    assert (f.user, f.uid, f.groups, f.sudo_nopasswd) == ("nobody", 65534, ["nogroup"], False)
    assert [(n.content, n.mode) for n in f.netplan_files] == [(None, 0o600), (None, 0o600)]
    assert f.docker_error.startswith("permission denied while trying to connect to the Docker daemon socket")
    assert f.listening_tcp == {18355: None}  # no privilege, no process names
    assert f.firewall is None  # nft refused: unknown, not "no firewall" — we cannot tell
    assert f.hf_cache == "/nonexistent/.cache/huggingface" and f.hf_cache_free_bytes > 0


def test_the_address_a_node_is_reached_by_marks_its_management_interfaces():
    f = captured("gather.host.txt", reach_addrs=["127.0.0.1"])
    assert f.management_interfaces == ["eth0", "lo"]
    assert f.ports() == {} and f.up_ports() == {}


def test_the_controllers_own_fabric_address_is_not_management():
    # sparkctl running on spark1 reaches spark1 by its management address; that its own fabric twins hold
    # addresses (192.168.100.10 here) must not make them management interfaces.
    f = captured("gather.netns-root.txt", reach_addrs=["10.201.0.11"])
    assert "enP7s7" in f.management_interfaces
    fabric = {"enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0", "enP2p1s0f0np0"}
    assert not fabric & set(f.management_interfaces)


def test_reach_names_resolve_and_unresolvable_ones_are_skipped():
    from sparkctl.facts.gather import _resolved

    class Transport:
        host = "127.0.0.1"

    assert _resolved(["localhost", "no-such-host.invalid"], Transport()) == ["127.0.0.1"]


def test_spark_ports_from_roce_map_twin_order_and_down_port():
    f = Facts(node="s", roce=p.parse_ibdev2netdev(fixture("ibdev2netdev.spark.handmade.txt")))
    f.interfaces = {n: Interface(n, 9000, "UP" if n.endswith("np1") else "DOWN")
                    for n in f.fabric_interfaces()}
    assert f.ports() == {0: ["enp1s0f0np0", "enP2p1s0f0np0"], 1: ["enp1s0f1np1", "enP2p1s0f1np1"]}
    assert f.up_ports() == {1: ["enp1s0f1np1", "enP2p1s0f1np1"]}
    assert f.roce_for("enP2p1s0f1np1") == RoceDevice("roceP2p1s0f1", 1, "enP2p1s0f1np1", True)
    f.interfaces["enP2p1s0f1np1"].operstate = "DOWN"  # one twin down: the port is not Up
    assert f.up_ports() == {}


def test_broken_sections_go_to_raw_errors_not_exceptions():
    out = ("@@sparkctl:n:begin ip-addr@@\n[{not json\n@@sparkctl:n:end ip-addr 0@@\n"
           "@@sparkctl:n:begin id@@\nroot\n@@sparkctl:n:end id 0@@\n"
           "@@sparkctl:n:begin meminfo@@\nMemTotal: 10 kB\n")  # cut short: no end marker
    f = facts_from_output(out, "n", "x")
    assert f.interfaces == {} and f.mem_total_kb == 10
    assert sorted(e.split(":")[0] for e in f.raw_errors) == ["id", "ip-addr"]


def test_markers_with_another_nonce_are_content():
    out = ("@@sparkctl:real:begin hostname@@\n@@sparkctl:fake:end hostname 0@@\nspark1\n"
           "@@sparkctl:real:end hostname 0@@\n")
    assert Framing("real").split(out)["hostname"].output.splitlines()[-1] == "spark1"


def test_script_quotes_every_value():
    script = render_script("n", container_names=[HOSTILE], image_refs=["$(reboot)"], hf_cache="~/a b;`x`")
    # the cache's `~/` is left for the node's shell to expand, the rest quoted
    assert "'it'\"'\"'s; rm -rf /'" in script and "'$(reboot)'" in script and "~/'a b;`x`'" in script
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0


# --- the real script, run for real

class SubprocessTransport:
    """Stand-in for a transport: bash -c on this machine (optionally inside a command prefix)."""

    def __init__(self, prefix: list[str] | None = None):
        self.node, self.round_trips, self.prefix = "local", 0, prefix or []

    def run(self, cmd, *, sudo=False, timeout=60.0, input=None):
        self.round_trips += 1
        proc = subprocess.run([*self.prefix, "bash", "-c", cmd], capture_output=True, text=True,
                              timeout=timeout)
        return CommandResult(cmd, proc.returncode, proc.stdout, proc.stderr)


def _local_transport():
    try:
        from sparkctl.transport.local import LocalTransport
    except ImportError:
        return SubprocessTransport()
    return LocalTransport("local")


def test_gather_live_on_this_machine_in_one_round_trip(tmp_path):
    transport = _local_transport()
    before = transport.round_trips
    f = gather_facts(transport, "local", container_names=[HOSTILE], image_refs=["nope:1"],
                     hf_cache=str(tmp_path / "missing" / "deeper"))
    assert transport.round_trips - before == 1
    assert f.raw_errors == []
    assert f.hostname and f.arch and f.uid == os.getuid() and "lo" in f.interfaces
    assert f.home == os.path.expanduser("~")  # where ~ in node paths goes (state dir, HF cache)
    assert f.hf_cache_free_bytes and f.hf_cache_free_bytes > 0  # df on the nearest existing parent
    assert f.containers[HOSTILE].exists is False and f.images == {"nope:1": None}
    assert f.mem_total_kb > 0 and f.time > 1.7e9


def test_the_machine_name_is_the_kernel_s_read_by_the_shell_and_uname_s_on_a_kernel_without_it():
    """kernel.arch is what `uname -m` prints (Linux 6.1+): read by the shell, it is a process fewer on every read
    of the facts; a kernel without it (hidden here under an empty file) is asked with `uname -m`."""
    script = 'uname() { echo "uname $*" >&2; command uname "$@"; }\n' + render_script("n")
    machine = platform.machine()
    for hide in ("", "mount --bind /dev/null /proc/sys/kernel/arch && "):
        out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", f'{hide}bash -c "$0"',
                              script], capture_output=True, text=True, timeout=60)
        assert Framing("n").split(out.stdout)["arch"].output == f"{machine}\n"
        assert ("uname -m" in out.stderr) == bool(hide), out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"), reason="needs root to create a netns")
def test_gather_live_in_a_fresh_netns():
    ns = f"sfx-test-{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", ns], capture_output=True).returncode:
        pytest.skip("cannot create network namespaces here")
    try:
        sh = lambda *a: subprocess.run(["ip", "-n", ns, *a], check=True)  # noqa: E731
        sh("link", "add", "enp1s0f1np1", "mtu", "9000", "type", "veth", "peer", "name", "enP2p1s0f1np1",
           "mtu", "9000")
        sh("link", "set", "enp1s0f1np1", "up")
        sh("link", "set", "enP2p1s0f1np1", "up")
        sh("addr", "add", "192.168.100.10/24", "dev", "enp1s0f1np1")
        f = gather_facts(SubprocessTransport(["ip", "netns", "exec", ns]), "ns")
        assert f.raw_errors == []
        assert f.interfaces["enp1s0f1np1"].mtu == 9000
        assert [str(a) for a in f.interfaces["enp1s0f1np1"].ipv4()] == ["192.168.100.10/24"]
        assert f.ports() == {1: ["enp1s0f1np1", "enP2p1s0f1np1"]}
        assert json.dumps(sorted(f.interfaces))  # plain data
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_speeds_prefer_ethtool_and_ignore_unknown():
    text = "sysfs enp1s0f1np1 100000\nsysfs enp1s0f0np0 -1\nsysfs lo \nethtool enp1s0f1np1 200000Mb/s\n" \
           "ethtool enP2p1s0f1np1 Unknown!\n"
    assert p.parse_speeds(text) == {"enp1s0f1np1": 200000}


def test_session_ip_is_the_node_side_of_ssh_connection():
    assert p.parse_ssh_connection("10.0.0.5 51234 10.0.0.11 22\n") == "10.0.0.11"
    assert p.parse_ssh_connection("\n") is None


def test_concurrent_sections_print_in_place_and_match_a_sequential_run(tmp_path):
    """The slow sections run in the background; without mktemp the script runs them in order instead."""
    from sparkctl.facts.sections import FACT_SECTIONS

    background = {s.name for s in FACT_SECTIONS if s.concurrent or s.privileged}
    script = render_script("n", container_names=[HOSTILE], image_refs=["nope:1"], hf_cache=str(tmp_path))
    runs = {}
    for mode, prelude in (("concurrent", ""), ("sequential", "mktemp() { return 1; }\n")):
        out = subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=60).stdout
        runs[mode] = Framing("n").split(out)
    names = list(runs["concurrent"])
    # docker-info runs only when there is nothing to inspect, the guards only when guard dirs are given
    assert names == list(runs["sequential"]) and set(names) >= background - {"docker-info", "netplan-guards"}
    assert names.index("speed") < names.index("ssh-connection") < names.index("docker")
    # this machine's interfaces, sockets and memory move between two runs (other labs): compare what does not
    for name in names:
        assert runs["concurrent"][name].rc == runs["sequential"][name].rc, name
    for name in ("hostname", "id", "docker-cli", "docker", "firewall"):
        assert runs["concurrent"][name].output == runs["sequential"][name].output, name
    assert not list(tmp_path.parent.glob("tmp.*/speed"))  # the temp dir is removed


def _sec(name: str, body: str, rc: int) -> str:
    return f"@@sparkctl:n:begin {name}@@\n{body}\n@@sparkctl:n:end {name} {rc}@@\n"


def test_a_docker_that_timed_out_is_slow_not_absent():
    """Under load `timeout 15 docker ...` gives up (exit 124): the container is unknown, never "absent" (that
    would have bootstrap create it again over the running one), and a slow `docker ps` is not a denial."""
    slow = _sec("docker-cli", "/usr/bin/docker", 0) + _sec("docker", "", 124)
    f = facts_from_output(slow, "n", "x", container_names=["trtllm-multinode"])
    info = f.containers["trtllm-multinode"]
    assert info.status == "unknown" and not info.exists and "did not answer" in info.error
    assert not f.docker_access and "did not answer" in f.docker_error and not f.docker_denied
    absent = _sec("docker-cli", "/usr/bin/docker", 0) + _sec(
        "docker", '[]\n#err Error: inspecting object: no such object: "trtllm-multinode"', 125)
    f = facts_from_output(absent, "n", "x", container_names=["trtllm-multinode"])
    assert f.docker_access and f.containers["trtllm-multinode"].status == "absent"


def test_a_docker_that_could_not_tell_is_not_taken_for_an_absent_container():
    """podman with a broken storage answers `Error: getting graph driver info ...` (exit 125) for a container
    that runs: unknown, never absent; a plain `no such container` is absent."""
    broken = _sec("docker-cli", "/usr/bin/docker", 0) + _sec(
        "docker", '[]\n#err Error: getting graph driver info "d378": readlink /var/lib/containers/storage/'
                  'overlay/l/QUDA: no such file or directory', 125)
    f = facts_from_output(broken, "n", "x", container_names=["trtllm-multinode"])
    assert f.containers["trtllm-multinode"].status == "unknown"
    assert any("graph driver" in e for e in f.raw_errors)
    gone = _sec("docker-cli", "/usr/bin/docker", 0) + _sec(
        "docker", "[]\n#err Error: no such container trtllm-multinode", 125)
    f = facts_from_output(gone, "n", "x", container_names=["trtllm-multinode"])
    assert f.containers["trtllm-multinode"].status == "absent"


def test_a_new_fact_is_one_registry_entry(monkeypatch):
    """One FactSection is all a new fact needs: the script runs it in its place (in the background when it is
    concurrent), in the one round trip, and its read gets what it printed; a read that fails costs only itself."""
    from sparkctl.facts import sections

    reads: dict[str, tuple[str, bool]] = {}

    def remember(_f, got):
        reads[got.name] = (got.text.strip(), got.ok)

    def broken(_f, got):
        got.parsed(int, 0)

    added = [sections.FactSection("answer", lambda r: "echo 42", remember),
             sections.FactSection("slow-answer", lambda r: "sleep 0.2; echo 43; exit 3", remember, concurrent=True),
             sections.FactSection("nowhere", lambda r: None, remember),
             sections.FactSection("garbage", lambda r: "echo not-a-number", broken)]
    monkeypatch.setattr(sections, "FACT_SECTIONS", [*sections.FACT_SECTIONS, *added])
    transport = SubprocessTransport()
    f = gather_facts(transport, "local")
    assert transport.round_trips == 1
    assert reads == {"answer": ("42", True), "slow-answer": ("43", False)}  # "nowhere" did not run
    assert f.hostname and [e for e in f.raw_errors if e.startswith("garbage")] == [
        "garbage: ValueError: invalid literal for int() with base 10: 'not-a-number\\n'"]


def test_every_fact_section_has_one_name_and_runs_in_a_full_request():
    from sparkctl.facts.sections import FACT_SECTIONS, FactsRequest, rendered

    names = [s.name for s in FACT_SECTIONS]
    assert len(names) == len(set(names))
    full = FactsRequest(("c",), ("i:1",), "~/hf", ("/var/lib/sparkctl",))
    # docker-info (a bare `docker ps`) runs only when there is nothing to inspect
    assert [s.name for s, _ in rendered(full)] == [n for n in names if n != "docker-info"]
    assert "docker" not in [s.name for s, _ in rendered(FactsRequest())]


@pytest.mark.parametrize("who", ["nopasswd", "password", "nopasswd-no-tmp", "nopasswd-umask-077",
                                 "nopasswd-own-function"])
def test_root_only_sections_are_read_with_one_sudo(users, who):
    """Every section only root may read runs in ONE root shell: a user with passwordless sudo reads the firewall
    as root and asks sudo once per facts read (to run that shell), not once per command; a user whose sudo wants
    a password reads what a user may, and sudo is asked the same once. Without a temp dir (a full /tmp) every
    section runs in order, the privileged ones each with its own sudo. A strict umask of the user's does not hide
    what root wrote from them. A function of the user's shell (one their environment exports) is not given to the
    root shell: it runs the facts' functions and nothing else of the user's."""
    from tests.unit.ssh_kit import NOPASSWD_USER, SUDO_USER, counting_sudo

    if not shutil.which("iptables"):
        pytest.skip("no iptables on this machine to read as root")
    user = SUDO_USER if who == "password" else NOPASSWD_USER
    script = ({"nopasswd-no-tmp": "mktemp() { return 1; }\n", "nopasswd-umask-077": "umask 077\n"}.get(who, "")
              + render_script("n"))
    with counting_sudo() as (path, sudo_calls):
        exported = ["BASH_FUNC_iptables%%=() { echo the-user-s-own-function; }"] if who.endswith("function") else []
        out = subprocess.run(["runuser", "-u", user, "--", "env", f"PATH={path}", *exported, "bash", "-c", script],
                             capture_output=True, text=True, timeout=60).stdout
        asked = sudo_calls()
    f = facts_from_output(out, "n", "local")
    firewall = Framing("n").split(out)["firewall"].output
    assert f.user == user and f.raw_errors == []
    if who in ("nopasswd", "nopasswd-umask-077", "nopasswd-own-function"):
        assert f.sudo_nopasswd and asked == ["-n bash"], asked
        assert "-P INPUT" in firewall and "the-user-s-own-function" not in firewall, firewall
    elif who == "nopasswd-no-tmp":
        assert f.sudo_nopasswd and asked[0] == "-n true" and "-n iptables" in asked, asked
        assert "-P INPUT" in firewall, firewall
    else:
        assert not f.sudo_nopasswd and asked == ["-n bash"], asked
        assert "-P INPUT" not in firewall, firewall


def test_the_facts_leave_the_node_in_one_piece():
    """Printed as they come, the sections left the node as an SSH packet per printf (the controller paid ~0.1 ms
    of CPU for each); held in the temp dir, they come out at the end at once: a few reads of the pipe."""
    proc = subprocess.Popen(["bash", "-c", render_script("n")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    chunks = []
    while chunk := os.read(proc.stdout.fileno(), 1 << 20):
        chunks.append(chunk)
    proc.wait(timeout=60)
    assert "hostname" in Framing("n").split(b"".join(chunks).decode())
    assert len(chunks) <= 1 + len(b"".join(chunks)) // 65536, [len(c) for c in chunks]


def test_a_stopped_facts_read_still_sends_what_it_read(monkeypatch):
    """The sections' output is held on the node and sent in one piece at the end; a read stopped by the round
    trip's timeout (TERM to its process group) still sends the sections read before the stop."""
    from sparkctl.facts import sections

    monkeypatch.setattr(sections, "FACT_SECTIONS", [*sections.FACT_SECTIONS[:3],
                                                    sections.FactSection("stuck", lambda r: "sleep 30", _ignore),
                                                    *sections.FACT_SECTIONS[3:]])
    script = render_script("n")
    done = subprocess.run(["timeout", "-k", "5", "3", "bash", "-c", script], capture_output=True, text=True,
                          timeout=60)
    got = Framing("n").split(done.stdout)
    assert done.returncode == 124
    assert got["hostname"].output.strip() and "stuck" in got and "arch" not in got


def _ignore(_facts, _got):
    pass


def _fake_sysfs_class(root, devices: dict[str, tuple[str, str, str | None, str | None]]) -> None:
    """A /sys/class with RoCE devices: name -> (link layer, netdev, the netdev the GID table names or None, carrier
    or None: unreadable, as it is on a netdev administratively down)."""
    for name, (layer, netdev, gid_ndev, carrier) in devices.items():
        port = root / "infiniband" / name / "ports" / "1"
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port / "link_layer").write_text(layer + "\n")
        if gid_ndev is not None:
            (port / "gid_attrs" / "ndevs" / "0").write_text(gid_ndev + "\n")
        (root / "infiniband" / name / "device" / "net" / netdev).mkdir(parents=True)
        net = root / "net" / netdev
        net.mkdir(parents=True)
        if carrier is None:
            (net / "carrier").mkdir()  # there, and no read of it succeeds
        else:
            (net / "carrier").write_text(carrier + "\n")


def _roce_section(sys_class, ibdev2netdev: str = "") -> tuple[str, str]:
    """fact_roce run against `sys_class` mounted over /sys/class (a mount namespace of its own); `ibdev2netdev`: a
    stand-in of that name on PATH (it says that it ran)."""
    script = (f"{ibdev2netdev}\n" if ibdev2netdev else "") + render_script("n")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f'mount --bind {shlex.quote(str(sys_class))} /sys/class && bash -c "$0"', script],
                         capture_output=True, text=True, timeout=60)
    return Framing("n").split(out.stdout)["roce"].output, out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_roce_devices_are_read_from_sysfs_as_ibdev2netdev_reads_them(tmp_path):
    """The Spark's lines, read by the shell from sysfs as Mellanox's ibdev2netdev reads them (the GID table's netdev,
    else the PCI function's; Up only when the carrier reads 1): the script, a few dozen processes on a Spark, is not
    run at all."""
    _fake_sysfs_class(tmp_path, {
        "rocep1s0f0": ("Ethernet", "enp1s0f0np0", "enp1s0f0np0", None),
        "roceP2p1s0f0": ("Ethernet", "enP2p1s0f0np0", None, "0"),
        "rocep1s0f1": ("Ethernet", "enp1s0f1np1", "enp1s0f1np1", "1"),
        "roceP2p1s0f1": ("Ethernet", "enP2p1s0f1np1", None, "1")})
    stand_in = 'ibdev2netdev() { echo "ibdev2netdev ran" >&2; }'
    roce, err = _roce_section(tmp_path, stand_in)
    assert "ibdev2netdev ran" not in err
    assert sorted(roce.splitlines()) == sorted([
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)", "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)",
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)", "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)"])
    assert {(d.device, d.netdev, d.up) for d in p.parse_ibdev2netdev(roce)} >= {("rocep1s0f1", "enp1s0f1np1", True)}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_ibdev2netdev_answers_where_sysfs_has_no_roce_port_or_an_infiniband_one(tmp_path):
    stand_in = 'ibdev2netdev() { echo "ibdev2netdev ran" >&2; echo "mlx5_0 port 1 ==> ib0 (Up)"; }'
    (tmp_path / "none" / "net").mkdir(parents=True)
    _fake_sysfs_class(tmp_path / "ib", {"mlx5_0": ("InfiniBand", "ib0", None, "1")})
    for sys_class in (tmp_path / "none", tmp_path / "ib"):
        roce, err = _roce_section(sys_class, stand_in)
        assert "ibdev2netdev ran" in err and roce == "mlx5_0 port 1 ==> ib0 (Up)\n"
    assert _roce_section(tmp_path / "none")[0] == ""  # neither: nothing to say


def test_id_s_one_line_reads_as_id_un_and_id_gn_print_it(users):
    """The facts ask `id` once: its line gives the user's name and groups in the order `id -un` and `id -Gn` print
    them (compared with both, for root and for a user with groups of its own on this machine)."""
    from tests.unit.ssh_kit import SUDO_USER

    def run(user: str, *args: str) -> str:
        return subprocess.run(["runuser", "-u", user, "--", *args], capture_output=True, text=True, check=True).stdout

    for user in ("root", SUDO_USER):
        euid = run(user, "bash", "-c", 'echo "$EUID"')
        assert p.parse_id(run(user, "id") + euid) == (run(user, "id", "-un").strip(), int(euid),
                                                       run(user, "id", "-Gn").split())
    line = "uid=1001(nvidia) gid=1001(nvidia) euid=0(root) groups=27(sudo),1001(nvidia),4242 context=u:r:t:s0\n0\n"
    assert p.parse_id(line) == ("root", 0, ["nvidia", "sudo", "4242"])
    assert p.parse_id("nvidia\n1001\nnvidia docker\n") == ("nvidia", 1001, ["nvidia", "docker"])  # older facts
    spaced = "uid=1001(nvidia) gid=5000(domain users) groups=5000(domain users),999(docker)\n1001\n"
    assert p.parse_id(spaced) == ("nvidia", 1001, ["domain users", "docker"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_netplan_files_are_printed_by_the_shell_and_read_back_exactly(tmp_path):
    """Each netplan file is printed as its lines by the shell (a `base64` was a process per file), and read back as
    it is: a last line without its newline, a CR, UTF-8, an empty file; one with a NUL, which the shell's `read`
    cannot keep, goes by its base64."""
    contents = {"00-plain.yaml": b"network:\n  version: 2\n", "10-no-newline.yaml": b"network:\n  version: 2",
                "20-crlf.yaml": b"network:\r\n  version: 2\r\n", "30-utf8.yaml": "# r\u00e9seau \u2014\n".encode(),
                "40-empty.yaml": b"", "50-nul.yaml": b"network:\x00\n  version: 2\n",
                "60-blank-lines.yaml": b"\n\n|x\n~y\n"}
    for name, content in contents.items():
        (tmp_path / name).write_bytes(content)
        (tmp_path / name).chmod(0o600)
    mount = f'mount --bind {shlex.quote(str(tmp_path))} /etc/netplan && bash -c "$0"'
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", mount, render_script("n")],
                         capture_output=True, timeout=60)
    # decoded as the transports decode (transport/ssh.py: no newline translation)
    section = Framing("n").split(out.stdout.decode(errors="replace"))["netplan"].output
    files = {Path(f.path).name: f for f in p.parse_netplan(section)}
    assert {name: f.content for name, f in files.items()} == {n: c.decode() for n, c in contents.items()}
    assert {f.mode for f in files.values()} == {0o600}
    assert "50-nul.yaml" in section and section.count(" text /etc/netplan/") == len(contents) - 1


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_speeds_are_sysfs_s_and_ethtool_is_asked_only_where_a_link_with_carrier_has_none_there(tmp_path):
    _fake_sysfs_class(tmp_path, {"rocep1s0f1": ("Ethernet", "enp1s0f1np1", None, "1"),
                                 "roceP2p1s0f1": ("Ethernet", "enP2p1s0f1np1", None, "1"),
                                 "rocep1s0f0": ("Ethernet", "enp1s0f0np0", None, "0")})
    (tmp_path / "net" / "enp1s0f1np1" / "speed").write_text("200000\n")
    (tmp_path / "net" / "enP2p1s0f1np1" / "speed").mkdir()  # there, and no read of it succeeds
    (tmp_path / "net" / "enp1s0f0np0" / "speed").write_text("-1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ethtool").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/asked\n'
                                     'printf \'Settings for %s:\\n\\tSpeed: 100000Mb/s\\n\\tDuplex: Full\\n\' "$1"\n')
    (bin_dir / "ethtool").chmod(0o755)
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f'mount --bind {shlex.quote(str(tmp_path))} /sys/class && bash -c "$0"', render_script("n")],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert p.parse_speeds(Framing("n").split(out.stdout)["speed"].output) == {"enp1s0f1np1": 200_000,
                                                                               "enP2p1s0f1np1": 100_000}
    assert (tmp_path / "asked").read_text() == "enP2p1s0f1np1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="gives a dir to another user")
def test_the_facts_temp_dir_is_in_the_login_s_runtime_dir_where_it_is_the_user_s_own(tmp_path):
    """The facts write a few dozen small files a run: in the login's runtime dir (logind's tmpfs) where there is one
    of the user's own, else in mktemp's default (/tmp, a disk filesystem on DGX OS); removed at the end either way."""
    log = tmp_path / "mktemp.log"
    stub = f'mktemp() {{ echo "$*" >> {log}; command mktemp "$@"; }}\n'
    own, others = tmp_path / "run-user", tmp_path / "someone-else"
    own.mkdir(mode=0o700)
    others.mkdir()
    os.chown(others, 65534, 65534)
    for runtime, expected in ((own, f"-d -p {own}"), (others, "-d"), (None, "-d")):
        log.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        if runtime is not None:
            env["XDG_RUNTIME_DIR"] = str(runtime)
        out = subprocess.run(["bash", "-c", stub + render_script("n")], capture_output=True, text=True, timeout=60,
                             env=env)
        assert Framing("n").split(out.stdout)["hostname"].output.strip()
        assert log.read_text().splitlines() == [expected], runtime
        assert list(own.iterdir()) == []
