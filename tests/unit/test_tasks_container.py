"""container.* and mpi.hostfile check/apply against recorded facts, through a fake transport that records commands."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from sparkctl.facts import ContainerInfo
from sparkctl.inventory import Inventory
from sparkctl.taskgraph.task import TaskFailed
from sparkctl.tasks.container import image as image_task
from sparkctl.tasks.container.image import ContainerImageTask
from sparkctl.tasks.container.run import ContainerRunTask
from sparkctl.tasks.container.ssh import (
    ContainerSshTask,
    container_files_as_root,
    desired_ssh_files,
    listening,
)
from sparkctl.tasks.container.state import ContainerStateTask
from sparkctl.tasks.mpi.hostfile import HostfileTask, tagged_output
from sparkctl.tasks.mpi.reads import HOSTFILE_READS
from sparkctl.transport.base import CommandResult
from sparkctl.transport.framing import Framing
from tests.taskkit import framed
from tests.unit.container_kit import (
    PUBS,
    cluster,
    node_facts,
    pair,
    running_like_plan,
    ssh_listing,
)

HOSTILE = "a b'c\";$(touch /tmp/pwned)`x`"
# --- container.run ------------------------------------------------------------------------------------------

def test_env_uses_each_nodes_own_up_port():
    inv, facts = pair(port2=0)
    facts["spark1"] = node_facts("spark1", 1, port=1)
    cctx, _ = cluster(inv, facts)
    env1 = cctx.plan().nodes["spark1"].container.env
    env2 = cctx.plan().nodes["spark2"].container.env
    assert env1["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
    assert env1["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert env2["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0,enP2p1s0f0np0"
    assert env2["NCCL_IB_HCA"] == "rocep1s0f0,roceP2p1s0f0"
    for key in ("UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"):
        assert env2[key] == "enp1s0f0np0,enP2p1s0f0np0"


def test_absent_container_is_created_with_quoted_hostile_env():
    """The inventory refuses such a value; the command builder quotes it anyway (defence in depth)."""
    inv, facts = pair()
    inv.container.env = {"EXTRA": HOSTILE}
    cctx, _ = cluster(inv, facts, {"spark1": [(r"docker inspect --format", "running 0\n")]})
    ctx, task = cctx.nodes["spark1"], ContainerRunTask()
    changes = task.check(ctx)
    assert [c.summary for c in changes] == ["create container trtllm-multinode"]
    import sparkctl.tasks.container.run as mod
    mod.START_GRACE_S = 0
    task.apply(ctx, changes)
    run = next(c for c in ctx.transport.commands if c.startswith("docker run"))
    argv = shlex.split(run)
    assert f"EXTRA={HOSTILE}" in argv
    assert argv == ctx.plan().nodes["spark1"].container.run_argv()
    assert "--network" in argv and "host" in argv and "/dev/infiniband:/dev/infiniband" in argv


def test_same_spec_running_is_ok():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1")
    assert ContainerRunTask().check(cctx.nodes["spark1"]) == []


def test_the_container_comes_back_by_itself_and_a_policy_changed_by_hand_is_put_back():
    """--restart unless-stopped: the node's docker starts it at boot and when it dies; `docker update --restart no`
    keeps the spec label, so the policy docker reports is judged too."""
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    spec = cctx.plan().nodes["spark1"].container
    argv = spec.run_argv()
    assert argv[argv.index("--restart") + 1] == "unless-stopped" and "--rm" not in argv
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1", restart_policy="unless-stopped")
    assert ContainerRunTask().check(cctx.nodes["spark1"]) == []
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1", restart_policy="no")
    changes = ContainerRunTask().check(cctx.nodes["spark1"])
    assert [(c.payload, c.summary) for c in changes] == [
        ("recreate", "recreate container trtllm-multinode: restart policy no -> unless-stopped")]


@pytest.mark.parametrize("listen", [["192.168.100.10", "192.168.101.10", "10.0.0.1"], ["*"], ["0.0.0.0"]])
def test_an_ssh_port_answering_on_the_management_address_recreates_the_container(listen):
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1")
    facts["spark1"].listening_tcp[2233] = "sshd"
    facts["spark1"].listening_addresses[2233] = listen
    (change,) = ContainerRunTask().check(cctx.nodes["spark1"])
    assert change.payload == "recreate"
    assert change.summary == ("recreate container trtllm-multinode: its ssh port 2233 answers on the management "
                              "address 10.0.0.1 (the mesh belongs on the fabric)")
    facts["spark1"].listening_addresses[2233] = ["192.168.100.10", "192.168.101.10"]
    assert ContainerRunTask().check(cctx.nodes["spark1"]) == []


def test_a_container_docker_did_not_report_in_time_is_asked_again_never_recreated():
    """Under load `docker inspect` may time out: the container is then unknown, and container.run neither creates
    it over the running one nor calls the port taken; asked again, the second answer decides."""
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    slow = ContainerInfo("trtllm-multinode", False, status="unknown")
    answers = [running_like_plan(cctx, "spark1")]
    ctx = cctx.nodes["spark1"]

    def facts_again(refresh=False, _f=facts["spark1"]):
        if refresh:
            _f.containers["trtllm-multinode"] = answers.pop(0)
        return _f

    facts["spark1"].containers["trtllm-multinode"] = slow
    ctx.facts = facts_again
    assert ContainerRunTask().check(ctx) == []
    answers[:] = [slow]
    facts["spark1"].containers["trtllm-multinode"] = slow
    with pytest.raises(TaskFailed) as err:
        ContainerRunTask().check(ctx)
    assert "could not be read" in err.value.message and "nothing was changed" in err.value.hint
    assert not any(c.startswith("docker run") for c in ctx.transport.commands)


def test_wrong_socket_ifname_recreates_with_diff():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    info = running_like_plan(cctx, "spark1", labels={})
    info.env["NCCL_SOCKET_IFNAME"] = "enP7s7"
    facts["spark1"].containers["trtllm-multinode"] = info
    changes = ContainerRunTask().check(cctx.nodes["spark1"])
    assert len(changes) == 1 and changes[0].payload == "recreate"
    assert "NCCL_SOCKET_IFNAME: enP7s7 -> enp1s0f1np1,enP2p1s0f1np1" in changes[0].summary
    assert "-NCCL_SOCKET_IFNAME=enP7s7" in changes[0].diff
    assert "+NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1" in changes[0].diff


def test_stopped_container_is_started():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts, {"spark1": [(r"docker inspect --format", "running 0\n")]})
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1", running=False,
                                                                       status="exited")
    ctx = cctx.nodes["spark1"]
    changes = ContainerRunTask().check(ctx)
    assert changes[0].payload == "start"
    import sparkctl.tasks.container.run as mod
    mod.START_GRACE_S = 0
    ContainerRunTask().apply(ctx, changes)
    assert "docker start trtllm-multinode" in ctx.transport.commands


def test_a_container_that_will_not_start_is_made_again_from_the_plan(monkeypatch):
    """A run cut while `docker run` created the container can leave the runtime's state behind: `docker start`
    then fails (runc: "container with given ID already exists"). Nothing lives in the container: it is made again."""
    inv, facts = pair()
    cctx, _ = cluster(inv, facts, {"spark1": [
        (r"docker start", CommandResult("docker start", 125, "",
                                        "Error: runc create failed: container with given ID already exists")),
        (r"docker inspect --format", "running 0\n")]})
    facts["spark1"].containers["trtllm-multinode"] = running_like_plan(cctx, "spark1", running=False,
                                                                       status="created")
    ctx = cctx.nodes["spark1"]
    ctx.invalidate = lambda: None  # the recorded facts stay (this harness gathers none)
    changes = ContainerRunTask().check(ctx)
    assert changes[0].payload == "start"
    import sparkctl.tasks.container.run as mod
    monkeypatch.setattr(mod, "START_GRACE_S", 0)
    ContainerRunTask().apply(ctx, changes)
    commands = ctx.transport.commands
    start = commands.index("docker start trtllm-multinode")
    assert "docker rm -f trtllm-multinode" in commands[start + 1] and commands[-2].startswith("docker run ")


def test_port_taken_by_another_process_names_it():
    inv, facts = pair()
    facts["spark1"].listening_tcp[2233] = "python3"
    ss = '0 5 0.0.0.0:2233 0.0.0.0:* users:(("python3",pid=4242,fd=3))\n'
    cctx, _ = cluster(inv, facts, {"spark1": [(r"ss -ltnpH", ss)]})
    ctx = cctx.nodes["spark1"]
    changes = ContainerRunTask().check(ctx)
    with pytest.raises(TaskFailed) as err:
        ContainerRunTask().apply(ctx, changes)
    assert "python3 (pid 4242)" in err.value.message and "2233" in err.value.message
    assert not any(c.startswith("docker run") for c in ctx.transport.commands)


def pulling(outputs: list[str]):
    """Rules for a detached pull: the start prints the log path, then each `cat` shows the next output."""
    reads = iter(outputs)
    last = {"text": ""}

    def cat() -> str:
        last["text"] = next(reads, last["text"])
        return last["text"]

    return [(r"setsid nohup sh -c", "/tmp/sparkctl-pull.abc123\n"), (r"^cat /tmp/sparkctl-pull", cat)]


def test_missing_image_pull_refused_gives_login_hint(monkeypatch):
    monkeypatch.setattr(image_task, "PULL_POLL_S", 0)
    inv, facts = pair()
    facts["spark1"].images = {inv.container.image: None}
    denied = "Error response from daemon: unauthorized: authentication required\nsparkctl-pull-exit=1\n"
    cctx, _ = cluster(inv, facts, {"spark1": pulling([denied])})
    ctx = cctx.nodes["spark1"]
    changes = ContainerImageTask().check(ctx)
    assert changes[0].summary.startswith("pull ")
    with pytest.raises(TaskFailed) as err:
        ContainerImageTask().apply(ctx, changes)
    assert "docker login nvcr.io" in err.value.hint
    assert any(c.startswith("rm -f /tmp/sparkctl-pull.abc123") for c in ctx.transport.commands)


def test_a_pull_reports_layers_while_it_runs(monkeypatch):
    monkeypatch.setattr(image_task, "PULL_POLL_S", 0)
    inv, facts = pair()
    facts["spark1"].images = {inv.container.image: None}
    first = "1.3.0rc12: Pulling from nvidia/tensorrt-llm/release\naaaaaa1: Pulling fs layer\nbbbbbb2: Already exists\n"
    second = first + "aaaaaa1: Downloading\naaaaaa1: Pull complete\n"
    cctx, events = cluster(inv, facts, {"spark1": pulling([first, second, second + "sparkctl-pull-exit=0\n"])})
    ctx = cctx.nodes["spark1"]
    ContainerImageTask().apply(ctx, ContainerImageTask().check(ctx))
    progress = [e.message for e in events if e.data.get("progress")]
    assert progress[0].endswith("1/2 layers, 0s") and progress[1].endswith("2/2 layers, 0s")
    start = next(c for c in ctx.transport.commands if "setsid nohup" in c)
    assert "docker pull nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12" in start


def test_pull_progress_counts_layers():
    assert image_task.pull_progress("x: Pulling fs layer\nabcdef: Pulling fs layer\nabcdef: Pull complete\n"
                                          "123456: Already exists\n") == (2, 2)


# --- container.state / container.ssh ------------------------------------------------------------------------

def test_state_generates_keys_and_writes_entrypoint_on_the_node():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    ctx = cctx.nodes["spark1"]
    changes = ContainerStateTask().check(ctx)
    summaries = " | ".join(c.summary for c in changes)
    assert "entrypoint.sh" in summaries and "client key" in summaries and "host key" in summaries
    ContainerStateTask().apply(ctx, changes)
    keygen = [c for c in ctx.transport.commands if "ssh-keygen" in c][0]
    assert keygen.count("ssh-keygen") == 2 and "/home/nvidia/.local/state/sparkctl/pair/container-ssh" in keygen
    assert ctx.transport.files["/home/nvidia/.local/state/sparkctl/pair/entrypoint.sh"] == ctx.plan().entrypoint
    assert "StrictHostKeyChecking yes" in ctx.plan().entrypoint


def run_as_root_read(script: str, proc) -> tuple[int, dict[str, str]]:
    """The container read as root, against `proc` bind-mounted over /proc in a mount namespace of its own."""
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                          f'mount --bind {shlex.quote(str(proc))} /proc && bash -c "$0"', f"{script}\nexit $?"],
                         capture_output=True, text=True, timeout=60)
    sections = Framing("n").split(out.stdout)
    return out.returncode, {name: s.output for name, s in sections.items()}


def test_the_container_s_files_are_read_as_root_through_its_root_and_never_through_a_symlink(tmp_path):
    container_id = "31454d56c8392d1e94da3c45bc600ee85205634ff39bb9d35b434ef43098c5ee"
    inv, facts = pair()
    facts["spark1"].sudo_nopasswd = True
    facts["spark1"].containers["trtllm-multinode"] = ContainerInfo(
        "trtllm-multinode", True, running=True, status="running", id=container_id, pid=4242)
    cctx, _ = cluster(inv, facts)
    script = container_files_as_root(cctx, "spark1", Framing("n"))
    proc = tmp_path / "proc"
    root = proc / "4242" / "root"
    (root / "root" / ".ssh").mkdir(parents=True)
    (root / "etc").mkdir()
    (proc / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{container_id}.scope\n")
    (proc / "net").mkdir()
    (proc / "net" / "tcp6").write_text("  sl  local_address rem_address   st\n")
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    sshd = "   0: 00000000:08B9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n"
    (proc / "net" / "tcp").write_text(header + sshd)  # the container's sshd listens on its port, 2233
    (root / "root/.ssh/authorized_keys").write_text("ssh-ed25519 AAA1 c@spark1\n")
    (root / "root/.ssh/known_hosts").write_text("[192.168.100.12]:2233 ssh-ed25519 HHH2\n")
    (root / "etc/openmpi-hostfile").write_text("192.168.100.11 slots=1\n")
    rc, found = run_as_root_read(script, proc)
    written = "".join(f"{(st := (root / 'root/.ssh' / f).stat()).st_ino}:{int(st.st_mtime)}\n"
                      for f in ("authorized_keys", "known_hosts"))
    assert rc == 0 and found == {"in-authorized_keys": "ssh-ed25519 AAA1 c@spark1\n",
                                 "in-known_hosts": "[192.168.100.12]:2233 ssh-ed25519 HHH2\n",
                                 "in-written": written, "container-hostfile": "192.168.100.11 slots=1\n"}
    # a path through a symlink would resolve against the node's root: the read fails, and its task reads over ssh
    (root / "etc/openmpi-hostfile").unlink()
    (root / "etc/openmpi-hostfile").symlink_to("/etc/hostname")
    assert run_as_root_read(script, proc) == (4, {})
    # another container now has that pid (or none has): nothing of it counts
    (root / "etc/openmpi-hostfile").unlink()
    (proc / "4242" / "cgroup").write_text("0::/system.slice/docker-0123abcd.scope\n")
    assert run_as_root_read(script, proc) == (3, {})
    # its sshd does not listen yet: its entrypoint may not have put the keys in place, and the ssh read waited for it
    (proc / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{container_id}.scope\n")
    (proc / "net" / "tcp").write_text(header)
    assert run_as_root_read(script, proc) == (5, {})
    # the container's root cannot be entered (it exited): nothing is read as if its files were absent
    (proc / "net" / "tcp").write_text(header + sshd)
    root.rename(proc / "4242" / "gone")
    assert run_as_root_read(script, proc) == (6, {})


@pytest.mark.parametrize("why", ["a sudo password", "not running", "no pid", "an id not docker's"])
def test_the_container_s_files_are_not_read_as_root_where_they_cannot_be(why):
    inv, facts = pair()
    facts["spark1"].sudo_nopasswd = why != "a sudo password"
    facts["spark1"].containers["trtllm-multinode"] = ContainerInfo(
        "trtllm-multinode", True, running=why != "not running", status="running",
        id="abc; rm -rf /" if why == "an id not docker's" else "abc123", pid=None if why == "no pid" else 4242)
    cctx, _ = cluster(inv, facts)
    assert container_files_as_root(cctx, "spark1", Framing("n")) is None


def test_a_root_owned_hf_cache_fails_with_the_chown_line():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts, rules={"spark1": [(r"hf_cache_not_writable",
                                                     framed([("have", "hf_cache\nhf_cache_not_writable\n")]))]})
    with pytest.raises(TaskFailed) as err:
        ContainerStateTask().check(cctx.nodes["spark1"])
    assert "is not writable by nvidia" in err.value.message
    assert err.value.hint == "sudo chown -R nvidia: /home/nvidia/.cache/huggingface"


def test_ssh_files_pin_every_host_key_at_fabric_ip_and_port():
    inv, facts = pair()
    cctx, _ = cluster(inv, facts)
    pubs = {"spark1": ("ssh-ed25519 AAA1 c@spark1", "ssh-ed25519 HHH1 h"),
            "spark2": ("ssh-ed25519 AAA2 c@spark2", "ssh-ed25519 HHH2 h")}
    want = desired_ssh_files(cctx, pubs)
    only_fabric = 'from="192.168.100.0/24,192.168.101.0/24" '
    assert want["authorized_keys"] == (f"{only_fabric}ssh-ed25519 AAA1 c@spark1\n"
                                       f"{only_fabric}ssh-ed25519 AAA2 c@spark2\n")
    assert "[192.168.100.11]:2233,[192.168.101.11]:2233 ssh-ed25519 HHH2" in want["known_hosts"]


def test_removed_peer_key_in_one_container_is_repaired_by_exec():
    inv, facts = pair()
    pubs = {"spark1": ("ssh-ed25519 AAA1 c@spark1", "ssh-ed25519 HHH1 h"),
            "spark2": ("ssh-ed25519 AAA2 c@spark2", "ssh-ed25519 HHH2 h")}

    def listing(node, drop_peer=False):
        cctx0, _ = cluster(inv, facts)
        want = desired_ssh_files(cctx0, pubs)
        auth = "ssh-ed25519 AAA1 c@spark1\n" if drop_peer else want["authorized_keys"]
        return framed([("sshd", "listening\n"), ("client", pubs[node][0] + "\n"), ("host", pubs[node][1] + "\n"),
                       ("node-authorized_keys", want["authorized_keys"]), ("node-known_hosts", want["known_hosts"]),
                       ("in-authorized_keys", auth), ("in-known_hosts", want["known_hosts"])])

    rules = {n: [(r":begin client@@", listing(n, n == "spark2"))] for n in ("spark1", "spark2")}
    cctx, _ = cluster(inv, facts, rules)
    changes = ContainerSshTask().check(cctx)
    assert [c.summary for c in changes] == ["update spark2: /root/.ssh/authorized_keys in the container"]
    ContainerSshTask().apply(cctx, changes)
    (container, cmd, content), = cctx.nodes["spark2"].transport.execs
    assert container == "trtllm-multinode" and "authorized_keys" in cmd and "AAA2" in content


# --- mpi.hostfile -------------------------------------------------------------------------------------------

def test_wrong_hostfile_in_one_container_is_rewritten():
    inv, facts = pair()
    good = "192.168.100.10\n192.168.100.11\n"
    rules = {"spark1": [(r"cat .*openmpi-hostfile", hostfiles(good, good))],
             "spark2": [(r"cat .*openmpi-hostfile", hostfiles(good, "10.0.0.9\n"))]}
    cctx, _ = cluster(inv, facts, rules)
    assert cctx.plan().hostfile == good
    changes = HostfileTask().check(cctx)
    assert [c.payload for c in changes] == [("spark2", "container")]
    HostfileTask().apply(cctx, changes)
    (_, cmd, content), = cctx.nodes["spark2"].transport.execs
    assert content == good and cmd.endswith("/etc/openmpi-hostfile")


def test_hostfile_verified_by_mpirun_hostnames_in_rank_order():
    inv, facts = pair()
    good = "192.168.100.10\n192.168.100.11\n"
    out = "[1,1]<stdout>:spark2\n[1,0]<stdout>:spark1\n"
    rules = {n: [(r"cat .*openmpi-hostfile", hostfiles(good, good)), (r"mpirun", out)]
             for n in ("spark1", "spark2")}
    cctx, _ = cluster(inv, facts, rules)
    assert HostfileTask().check(cctx) == []
    assert tagged_output(out) == {0: ["spark1"], 1: ["spark2"]}
    rules["spark1"][1] = (r"mpirun", CommandResult("m", 1, "", "ORTE was unable to reliably start"))
    cctx, _ = cluster(inv, facts, rules)
    with pytest.raises(TaskFailed) as err:
        HostfileTask().check(cctx)
    assert "ORTE was unable" in " ".join(err.value.details)


def test_hostfile_check_and_mpirun_share_one_round_trip_per_node():
    inv, facts = pair()
    good = "192.168.100.10\n192.168.100.11\n"
    head_out = hostfiles(good, good, ("mpirun", "[1,1]<stdout>:spark2\n[1,0]<stdout>:spark1\n", 0))
    rules = {"spark1": [(r"openmpi-hostfile", head_out)],
             "spark2": [(r"openmpi-hostfile", hostfiles(good, good))]}
    cctx, _ = cluster(inv, facts, rules)
    assert HostfileTask().check(cctx) == []
    for node in ("spark1", "spark2"):
        assert cctx.nodes[node].transport.round_trips == 1 and cctx.nodes[node].transport.execs == []
    head_cmd, = cctx.nodes["spark1"].transport.commands
    # mpirun runs only when the head's hostfile already is the planned one, under a timeout
    # (sized for the cluster: an mpirun over 2 nodes may take 60 s + 4 s per node)
    assert "mpirun" in head_cmd and shlex.quote(good.rstrip("\n")) in head_cmd and "timeout 68 mpirun" in head_cmd
    assert "mpirun" not in cctx.nodes["spark2"].transport.commands[0]
    rules["spark1"] = [(r"openmpi-hostfile", hostfiles(good, good, (
        "mpirun", "ORTE was unable to reliably start\n[1,0]<stdout>:spark1\n", 1)))]
    cctx, _ = cluster(inv, facts, rules)
    with pytest.raises(TaskFailed) as err:
        HostfileTask().check(cctx)
    assert "ORTE was unable" in " ".join(err.value.details) and "['spark1']" in err.value.message


def hostfiles(on_node: str, in_container: str, *more: tuple):
    """What mpi.hostfile's reads print: the hostfile on the node and in the container (and mpirun's run)."""
    return framed([("node-hostfile", on_node), ("container-hostfile", in_container), *more])


def test_container_ssh_noop_is_one_round_trip_per_node_with_the_mesh_proof_inside():
    inv, facts = pair()
    rules = {"spark1": [(r":begin client@@", ssh_listing(
                 inv, facts, "spark1", PUBS, "ok spark2 root@192.168.100.11\n"))],
             "spark2": [(r":begin client@@", ssh_listing(
                 inv, facts, "spark2", PUBS, "ok spark1 root@192.168.100.10\n"))]}
    cctx, _ = cluster(inv, facts, rules)
    assert ContainerSshTask().check(cctx) == []
    for node in ("spark1", "spark2"):
        script, = cctx.nodes[node].transport.commands
        assert listening(2233) in script and "ConnectTimeout=5" in script


def test_container_ssh_failure_is_asked_again_before_it_is_believed():
    """A peer's sshd may come up while the first try runs: one separate retry decides."""
    inv, facts = pair()
    first = {"spark1": "fail spark2 root@192.168.100.11 Connection refused\n",
             "spark2": "ok spark1 root@192.168.100.10\n"}
    for retry, expect_fail in (("ok spark2 root@192.168.100.11\n", False),
                               ("fail spark2 root@192.168.100.11 Permission denied (publickey)\n", True)):
        rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, PUBS, first[n])),
                     (r"^docker exec", retry if n == "spark1" else first[n])] for n in ("spark1", "spark2")}
        cctx, _ = cluster(inv, facts, rules)
        if expect_fail:
            with pytest.raises(TaskFailed) as err:
                ContainerSshTask().check(cctx)
            assert "spark1 -> spark2 (root@192.168.100.11): Permission denied" in err.value.details[0]
        else:
            assert ContainerSshTask().check(cctx) == []
        assert len(cctx.nodes["spark1"].transport.commands) == 2


def test_container_ssh_hands_its_hostfile_reads_to_mpi_hostfile_once_and_while_fresh():
    """The ssh mesh check and `mpirun hostname` share a docker exec; mpi.hostfile then needs no round trip."""
    inv, facts = pair()
    good = "192.168.100.10\n192.168.100.11\n"
    mpi = {"spark1": (("node-hostfile", good), ("container-hostfile", good),
                      ("mpirun", "[1,0]<stdout>:spark1\n[1,1]<stdout>:spark2\n", 0)),
           "spark2": (("node-hostfile", good), ("container-hostfile", good))}
    verdicts = {"spark1": "ok spark2 root@192.168.100.11\n",
                "spark2": "ok spark1 root@192.168.100.10\n"}
    rules = {n: [(r":begin client@@", ssh_listing(inv, facts, n, PUBS, verdicts[n], mpi[n]))]
             for n in ("spark1", "spark2")}
    cctx, _ = cluster(inv, facts, rules)
    assert ContainerSshTask().check(cctx) == []
    head_script = cctx.nodes["spark1"].transport.commands[0]
    assert head_script.index("ConnectTimeout=5") < head_script.index("mpirun")  # tries start, mpirun alongside
    assert HostfileTask().check(cctx) == []
    assert [cctx.nodes[n].transport.round_trips for n in ("spark1", "spark2")] == [1, 1]
    # taken once: the next check (e.g. after an apply) reads for itself
    HostfileTask().check(cctx)
    assert [cctx.nodes[n].transport.round_trips for n in ("spark1", "spark2")] == [2, 2]
    # anything re-read or changed on a node in between voids the hand-over
    ContainerSshTask().check(cctx)
    cctx.nodes["spark2"].invalidate()
    assert cctx.take_over(HOSTFILE_READS) is None


# --- vLLM: no sshd, mesh, hostfile or probe in the containers ----------------------------------------------------

def vllm_pair():
    inv, facts = pair()
    data = inv.model_dump(exclude_unset=True)
    data["container"].pop("image")
    data["serve"] = {"engine": "vllm"}
    return Inventory.model_validate(data), facts


def test_with_vllm_the_state_dir_holds_no_entrypoint_keys_or_probe():
    inv, facts = vllm_pair()
    cctx, _ = cluster(inv, facts)
    ctx = cctx.nodes["spark1"]
    changes = ContainerStateTask().check(ctx)
    assert [c.carried().kind for c in changes] == ["dirs", "dirs"]  # run/ and the HF cache, nothing else
    # no mesh read and no mpirun (the state dir's TensorRT-LLM files are only looked for, to be removed)
    read = ctx.transport.commands[0]
    assert "mpirun " not in read and "sshd" not in read and "keydir" not in read
    ContainerStateTask().apply(ctx, changes)
    assert ctx.transport.files == {} and not any("ssh-keygen" in c for c in ctx.transport.commands)


def test_a_switch_to_vllm_removes_what_tensorrt_llm_s_world_left_in_the_state_dir():
    inv, facts = vllm_pair()
    cctx, _ = cluster(inv, facts)
    ctx = cctx.nodes["spark1"]
    ctx.transport.rules.insert(0, (r"echo left:", framed([("have",
                                                           "left:container-ssh\nleft:entrypoint.sh\nrun\nhf_cache")])))
    (change,) = ContainerStateTask().check(ctx)
    assert change.carried().kind == "retire"
    assert change.summary.endswith("(vLLM's containers run no sshd or mpirun): container-ssh, entrypoint.sh")
    ContainerStateTask().apply(ctx, [change])
    removal = [c for c in ctx.transport.commands if "rm -rf" in c]
    assert removal and "/home/nvidia/.local/state/sparkctl/pair/container-ssh" in removal[0]
    assert "/home/nvidia/.local/state/sparkctl/pair/run/openmpi-hostfile" in removal[0]


def test_with_vllm_the_mesh_and_the_hostfile_are_not_applicable_and_with_trtllm_they_are():
    inv, facts = vllm_pair()
    cctx, _ = cluster(inv, facts)
    assert ContainerSshTask().not_applicable(cctx).endswith("not mpirun's: no ssh mesh between the containers")
    assert HostfileTask().not_applicable(cctx).endswith("not mpirun's: no Open MPI hostfile")
    trt, _ = cluster(*pair())
    assert ContainerSshTask().not_applicable(trt) is None and HostfileTask().not_applicable(trt) is None


def test_with_vllm_serve_config_writes_the_config_file_every_vllm_serve_reads():
    from sparkctl.tasks.serve.config import ServeConfigTask

    inv, facts = vllm_pair()
    cctx, _ = cluster(inv, facts)
    for node in ("spark1", "spark2"):
        ctx = cctx.nodes[node]
        (change,) = ServeConfigTask().check(ctx)
        path, text = change.carried()
        assert path == "/home/nvidia/.local/state/sparkctl/pair/run/serve/vllm.yaml"
        assert text == ctx.plan().launch.config_text()
        assert "method: eagle3" in text and "sparkctl-models/yuhuili" in text
        ServeConfigTask().apply(ctx, [change])
        assert ctx.transport.files[path] == text


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_listening_is_read_from_the_kernel_s_tables_and_only_a_listener_counts(family):
    """The shell's read of /proc/net/tcp{,6}, each table whole: a listening socket on the port counts; the same port
    held only by established connections (the server's side of one, and a client's remote end) does not, nor does a
    client's own local port."""
    import socket

    from sparkctl.tasks.container.ssh import listening

    af, host = (socket.AF_INET, "127.0.0.1") if family == "ipv4" else (socket.AF_INET6, "::1")
    server = socket.socket(af, socket.SOCK_STREAM)
    try:
        server.bind((host, 0))
    except OSError:
        server.close()
        pytest.skip(f"no {family} loopback here")
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection((host, port))
    accepted, _ = server.accept()

    def says(p: int) -> bool:
        return subprocess.run(["bash", "-c", listening(p)]).returncode == 0

    try:
        assert says(port)
        assert not says(client.getsockname()[1])  # a local port of an established connection
        server.close()
        assert not says(port)  # only the established pair holds it now
    finally:
        for s in (server, client, accepted):
            s.close()
