"""Labs of simulated Sparks, end to end with real systemd, sshd, networkd, netplan, podman and Open MPI."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

from sparkctl.tasks.network.safe_apply import NETPLAN_APPLY
from tests.lab.conftest import leftovers_of, poll, ssh

pytestmark = pytest.mark.lab

FABRIC_NETPLAN = """\
network:
  version: 2
  ethernets:
    enp1s0f1np1: {{addresses: [192.168.100.{n}/24], mtu: 9000, dhcp4: false, link-local: []}}
    enP2p1s0f1np1: {{addresses: [192.168.101.{n}/24], mtu: 9000, dhcp4: false, link-local: []}}
"""
CONTAINER = "trtllm-multinode"
SSH_CLIENT_CONFIG = "Host *\n  Port 2233\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"


def fabric_ip(index: int) -> str:
    return f"192.168.100.{10 + index}"


def addresses(lab, node: str, link: str) -> str:
    return lab.exec(node, ["ip", "-br", "addr", "show", link]).stdout


def apply_fabric_netplan(lab) -> None:
    for n in lab.nodes:
        lab.exec(n.name, "umask 077; cat > /etc/netplan/40-cx7.yaml", input=FABRIC_NETPLAN.format(n=10 + n.index),
                 check=True)
        assert lab.exec(n.name, ["sh", "-c", NETPLAN_APPLY]).returncode == 0
    for n in lab.nodes:
        assert poll(lambda n=n: fabric_ip(n.index) in addresses(lab, n.name, "enp1s0f1np1")), n.name


# --- a pair --------------------------------------------------------------------------------------------
def test_every_node_answers_ssh_as_nvidia_with_its_own_verified_host_key(lab_pair):
    host_keys = set()
    for n in lab_pair.nodes:
        result = ssh(lab_pair, n.name, "hostname; id -nG; sudo -n true && echo sudo-ok; cat /etc/dgx-release")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == n.name
        assert "docker" in result.stdout and "sudo-ok" in result.stdout and 'DGX_NAME="DGX Spark"' in result.stdout
        host_keys.add(lab_pair.node_path(n.name, "/etc/ssh/ssh_host_ed25519_key.pub").read_text())
        assert lab_pair.exec(n.name, ["systemctl", "is-system-running"]).stdout.strip() == "running"
    assert len(host_keys) == len(lab_pair.nodes)
    inventory = lab_pair.inventory_path.read_text()
    assert "topology: pair" in inventory and lab_pair.nodes[1].mgmt_ip in inventory


def test_fabric_starts_bare_and_nodes_have_no_default_route(lab_pair):
    for n in lab_pair.nodes:
        assert "inet" not in lab_pair.exec(n.name, ["ip", "addr", "show", "enp1s0f1np1"]).stdout
        assert "mtu 1500" in lab_pair.exec(n.name, ["ip", "link", "show", "enp1s0f1np1"]).stdout
        assert lab_pair.exec(n.name, ["ip", "route", "show", "default"]).stdout.strip() == ""


def test_ibdev2netdev_follows_the_link_state_of_the_peer(lab_pair):
    def line(twin: str) -> str:
        out = ssh(lab_pair, "spark1", "ibdev2netdev").stdout
        return next(row for row in out.splitlines() if f"==> {twin} " in row)

    assert line("enp1s0f1np1").endswith("(Up)") and line("enp1s0f0np0").endswith("(Down)")
    lab_pair.exec("spark2", ["ip", "link", "set", "enp1s0f1np1", "down"], check=True)
    try:
        assert poll(lambda: line("enp1s0f1np1").endswith("(Down)"), timeout=5)
        assert line("enP2p1s0f1np1").endswith("(Up)")
    finally:
        lab_pair.exec("spark2", ["ip", "link", "set", "enp1s0f1np1", "up"], check=True)
    assert poll(lambda: line("enp1s0f1np1").endswith("(Up)"), timeout=5)


def test_netplan_apply_sets_fabric_addresses_and_mtu_9000(lab_pair):
    apply_fabric_netplan(lab_pair)
    # networkd configures each link on its own: the second twin's MTU and address may come a moment after the first's
    assert poll(lambda: "mtu 9000" in lab_pair.exec("spark2", ["ip", "link", "show", "enP2p1s0f1np1"]).stdout)
    assert poll(lambda: "192.168.101.12/24" in addresses(lab_pair, "spark2", "enP2p1s0f1np1"))
    ping = lab_pair.exec("spark1", ["ping", "-c1", "-W2", "-M", "do", "-s", "8972", fabric_ip(2)])
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert lab_pair.node_path("spark1", "/etc/netplan/40-cx7.yaml").stat().st_mode & 0o777 == 0o600


def test_docker_run_with_host_network_as_nvidia_on_every_node(lab_pair, lab_image, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id_ed25519")],
                   check=True)
    key, pub = (tmp_path / "id_ed25519").read_text(), (tmp_path / "id_ed25519.pub").read_text()
    for n in lab_pair.nodes:
        # the container key set up by hand: the product does this later
        setup = ("mkdir -p ~/.ssh-mpi && cd ~/.ssh-mpi && cat > id_ed25519 && chmod 600 id_ed25519 && "
                 f"echo '{pub.strip()}' > id_ed25519.pub && cp id_ed25519.pub authorized_keys && "
                 f"printf '{SSH_CLIENT_CONFIG}' > config")
        assert ssh(lab_pair, n.name, setup, input=key).returncode == 0
        run = ssh(lab_pair, n.name, f"docker run -d --rm --name {CONTAINER} --network host --gpus all "
                  f"--ulimit memlock=-1 -v /home/nvidia/.ssh-mpi:/tmp/.ssh:ro {lab_image}", timeout=120)
        assert run.returncode == 0, run.stderr
        assert "--gpus" in run.stderr  # the wrapper says what it dropped
    for n in lab_pair.nodes:
        assert poll(lambda n=n: ":2233 " in lab_pair.exec(n.name, ["ss", "-ltn"]).stdout, timeout=30), n.name
        log = lab_pair.node_path(n.name, "/run/lab/docker.log").read_text()
        assert '"nvidia"' in log and "run" in log


def docker_exec(lab, node: str, command: str, timeout: float = 60):
    return ssh(lab, node, f"docker exec {CONTAINER} sh -c {json.dumps(command)}", timeout=timeout)


MPI_ENV = ("--map-by ppr:1:node -x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
           "--mca btl_tcp_if_include enp1s0f1np1 --mca oob_tcp_if_include enp1s0f1np1")


def test_mpirun_allreduce_crosses_the_fabric_between_containers(lab_pair):
    hostfile = "".join(f"{fabric_ip(n.index)}\n" for n in lab_pair.nodes)
    for n in lab_pair.nodes:
        assert docker_exec(lab_pair, n.name, f"printf '{hostfile}' > /etc/openmpi-hostfile").returncode == 0
    program = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
               "print('sum', c.allreduce(c.Get_rank() + 1), MPI.Get_processor_name())")
    result = docker_exec(lab_pair, "spark1",
                         "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; "
                         f"mpirun -np 2 --hostfile /etc/openmpi-hostfile {MPI_ENV} python3 -c \"{program}\"")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(result.stdout.split()) == sorted(["sum", "3", "spark1", "sum", "3", "spark2"])


def _http(url: str, body: dict | None = None, timeout: float = 10) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def test_serve_answers_under_mpirun_and_fails_when_a_peer_container_dies(lab_pair):
    for n in lab_pair.nodes:
        docker_exec(lab_pair, n.name, "mkdir -p /models/m && echo '{}' > /models/m/config.json && "
                    "touch /models/m/model.safetensors")
    launch = ("export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; "
              f"nohup mpirun -np 2 --hostfile /etc/openmpi-hostfile {MPI_ENV} -x SPARKCTL_LAB_MPI_TIMEOUT=5 "
              "trtllm-llmapi-launch trtllm-serve /models/m --backend pytorch --tp_size 2 "
              "--host 0.0.0.0 --port 8355 > /tmp/serve.log 2>&1 &")
    assert docker_exec(lab_pair, "spark1", launch).returncode == 0
    base = f"http://{lab_pair.nodes[0].mgmt_ip}:8355"
    assert poll(lambda: _http(f"{base}/health")[0] == 200, timeout=60), \
        docker_exec(lab_pair, "spark1", "cat /tmp/serve.log").stdout
    chat = {"model": "/models/m", "messages": [{"role": "user", "content": "hello sparks"}], "max_tokens": 8}
    status, body = _http(f"{base}/v1/chat/completions", chat)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"]
    assert ssh(lab_pair, "spark2", f"docker kill {CONTAINER}").returncode == 0
    assert poll(lambda: _http(f"{base}/v1/chat/completions", chat, timeout=10)[0] != 200, timeout=40)


# --- more topologies and teardown ---------------------------------------------------------------------
def test_ring_of_three_cables_port_0_to_the_next_port_1_and_leaves_nothing(lab_factory):
    lab = lab_factory(3, "ring", sudo_password=True)
    for n in lab.nodes:
        assert lab.fabric_up(n.name) == ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
    lab.exec("spark3", ["ip", "addr", "add", "192.168.7.3/24", "dev", "enp1s0f0np0"], check=True)
    lab.exec("spark1", ["ip", "addr", "add", "192.168.7.1/24", "dev", "enp1s0f1np1"], check=True)
    assert lab.exec("spark1", ["ping", "-c1", "-W2", "192.168.7.3"]).returncode == 0
    password = (lab.dir / "sudo-password").read_text().strip()
    assert (lab.dir / "sudo-password").stat().st_mode & 0o777 == 0o600
    assert ssh(lab, "spark2", "sudo -n true").returncode != 0
    assert ssh(lab, "spark2", "sudo -S -p '' true", input=password + "\n").returncode == 0
    assert ssh(lab, "spark2", "sudo -n /usr/bin/podman --version").returncode == 0
    assert lab.down() == []
    assert leftovers_of(lab) == []


def test_switch_of_four_carries_jumbo_frames_and_leaves_nothing(lab_factory):
    lab = lab_factory(4, "switch", port=0)
    for n in lab.nodes:
        assert lab.fabric_up(n.name) == ["enp1s0f0np0", "enP2p1s0f0np0"]
        lab.exec(n.name, f"ip link set enp1s0f0np0 mtu 9000 && ip addr add 192.168.100.{n.index}/24 "
                 "dev enp1s0f0np0", check=True)
    ping = lab.exec("spark1", ["ping", "-c1", "-W2", "-M", "do", "-s", "8972", "192.168.100.4"])
    assert ping.returncode == 0, ping.stdout
    assert lab.down() == []
    assert leftovers_of(lab) == []


def test_a_half_built_lab_is_torn_down_from_its_record(lab_factory, tmp_path, monkeypatch):
    from sparkctl.lab.lab import Lab, _free_lab_id
    from sparkctl.lab.state import LabState

    def crash(self, record):
        raise RuntimeError("simulated crash while booting")

    # what `sparkctl lab up` leaves when it dies mid-way: nodes started, nothing torn down
    state = LabState(lab_id=_free_lab_id(), dir=str(tmp_path), topology="pair", port=1)
    state.save()
    monkeypatch.setattr(Lab, "_wait_booted", crash)
    with pytest.raises(RuntimeError):
        Lab(state)._build(2, log=lambda _m: None)
    monkeypatch.undo()
    again = Lab.load(tmp_path)
    assert again.state.phase == "building" and any(n.pid for n in again.state.nodes)
    assert again.down() == []
    assert leftovers_of(again) == []


def test_cli_up_status_exec_down_on_a_single_spark(tmp_path):
    from sparkctl.cli.main import cli
    from sparkctl.lab.lab import Lab

    runner = CliRunner()
    directory = str(tmp_path / "single")
    assert runner.invoke(cli, ["lab", "up", "--topology", "pair", "--nodes", "3", "--dir", directory]).exit_code == 2
    assert runner.invoke(cli, ["lab", "up", "--renderer", "ifupdown", "--dir", directory]).exit_code == 2
    result = runner.invoke(cli, ["lab", "up", "--nodes", "1", "--topology", "single", "--dir", directory])
    try:
        assert result.exit_code == 0, result.output
        assert "spark1" in result.output and (tmp_path / "single" / "inventory.yaml").is_file()
        status = runner.invoke(cli, ["lab", "status", "--dir", directory])
        assert status.exit_code == 0 and "running" in status.output
        assert "netplan rendered by networkmanager" in status.output  # the lab's default: DGX OS's renderer
        exec_ = subprocess.run(["python3", "-m", "sparkctl.cli.main", "lab", "exec", "--dir", directory, "spark1",
                                "--", "sh", "-c", "ibdev2netdev; exit 5"], capture_output=True, text=True)
        assert exec_.returncode == 5 and exec_.stdout.count("(Down)") == 4
    finally:
        down = runner.invoke(cli, ["lab", "down", "--dir", directory])
    assert down.exit_code == 0, down.output
    assert leftovers_of(Lab.load(directory)) == []
