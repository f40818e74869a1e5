"""The lab's seeded faults, for the doctor lab tests and the chaos soak (benchmarks/soak.py): the repairable ones
(`seeds`: doctor --fix or a bootstrap rerun closes each) and those a person must close (`faults`, `system_faults`:
doctor names them, `manual` is the person's step)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from tests.lab.doctor_kit import CONTAINER, Seed, replace_container


def _env(key: str, value: str | None) -> Callable:
    def change(spec):
        env = {k: v for k, v in spec.env.items() if k != key}
        return dataclasses.replace(spec, env=env if value is None else {**env, key: value})
    return change


def _args(*extra: str) -> Callable:
    return lambda spec: dataclasses.replace(spec, docker_args=[*spec.docker_args, *extra])


def _expose(lab, node: str) -> None:
    mgmt = next(n.mgmt_ip for n in lab.state.nodes if n.name == node)
    # a second sshd started by hand in the container, on the management address (what an older sparkctl's or a
    # hand-started container's sshd did: it listened everywhere)
    result = lab.exec(node, f"docker exec {CONTAINER} /usr/sbin/sshd -f /dev/null -o ListenAddress={mgmt}:2233 "
                            "-o HostKey=/etc/ssh/sparkctl_host_ed25519_key -o PidFile=/run/seeded-sshd.pid")
    assert result.returncode == 0, result.stderr


def _restarting(lab, node: str) -> None:
    # a container whose command keeps failing under a restart policy (a hand-started one, or a broken image)
    replace_container(lab, node, lambda spec: dataclasses.replace(
        spec, docker_args=[*spec.docker_args, "--restart", "always"], command=["sh", "-c", "sleep 1; exit 1"]),
        serves=False)


def seeds(cluster: str) -> list[Seed]:
    return [
        # network: the issue's own case first
        Seed("twin-set-down", "fabric.port_down", "spark1", "ip link set enP2p1s0f1np1 down"),
        Seed("both-twins-set-down", "fabric.port_down", "spark2",
             "ip link set enp1s0f1np1 down; ip link set enP2p1s0f1np1 down"),
        Seed("mtu", "fabric.mtu_mismatch", "spark2", "ip link set enP2p1s0f1np1 mtu 1500"),
        Seed("link-local", "fabric.link_local", "spark1", "ip addr add 169.254.3.3/16 dev enp1s0f1np1"),
        Seed("address-extra", "fabric.address_extra", "spark2", "ip addr add 192.168.100.50/24 dev enp1s0f1np1"),
        Seed("twins-one-subnet", "fabric.twins_same_subnet", "spark1",
             "ip addr add 192.168.100.50/24 dev enP2p1s0f1np1"),
        Seed("address-missing", "fabric.address_missing", "spark2", "ip addr del 192.168.101.11/24 dev enP2p1s0f1np1"),
        Seed("address-foreign", "fabric.address_foreign", "spark2", "ip addr add 10.77.0.2/24 dev enp1s0f1np1"),
        Seed("address-duplicate", "fabric.address_duplicate", "spark2",
             "ip addr add 192.168.100.10/24 dev enp1s0f1np1",
             also=frozenset({("fabric.address_duplicate", "spark1"), ("fabric.address_extra", "spark2")})),
        Seed("netplan-conflict", "netplan.conflict", "spark1",
             "umask 077; printf 'network:\\n  version: 2\\n  ethernets:\\n    enp1s0f1np1:\\n"
             "      addresses: [192.168.100.77/24]\\n' > /etc/netplan/90-NM-lab.yaml"),
        Seed("netplan-drift", "netplan.drift", "spark2", "echo '# edited by hand' >> /etc/netplan/40-cx7.yaml"),
        # sparkctl's firewall flushed by hand, and a server a person started on every address (it ends by itself)
        Seed("port-exposed", "node.exposed_port", "spark2",
             "nft delete table inet sparkctl; setsid nohup timeout 600 python3 -m http.server 8765 --bind 0.0.0.0 "
             ">/dev/null 2>&1 < /dev/null & i=0; until ss -ltnH | grep -q ':8765 ' || [ $i -ge 50 ]; do sleep 0.1; "
             "i=$((i + 1)); done"),
        # ssh
        Seed("ssh-mesh", "ssh.mesh_broken", "spark2",
             f"sed -i '/sparkctl-{cluster}@/d' /home/nvidia/.ssh/authorized_keys"),
        # container
        Seed("container-exited", "container.exited", "spark2", f"docker stop -t 1 {CONTAINER}"),
        Seed("container-missing", "container.missing", "spark1", f"docker rm -f {CONTAINER}"),
        Seed("container-spec-drift", "container.spec_drift", "spark1", lambda lab, n: replace_container(
            lab, n, _args("--label", "seeded=by-hand"))),
        Seed("container-restarting", "container.restarting", "spark2", _restarting),
        Seed("container-ssh", "container.ssh_broken", "spark2",
             f"docker exec {CONTAINER} sh -c ': > /root/.ssh/authorized_keys'"),
        Seed("container-exposed", "container.ssh_exposed", "spark2", _expose),
        Seed("env-absent", "env.iface_absent", "spark2", lambda lab, n: replace_container(
            lab, n, _env("NCCL_SOCKET_IFNAME", "enp9s0f0np9"))),
        Seed("env-down", "env.iface_down", "spark1", lambda lab, n: replace_container(
            lab, n, _env("NCCL_SOCKET_IFNAME", "enp1s0f0np0"))),
        Seed("env-management", "env.management_iface", "spark1", lambda lab, n: replace_container(
            lab, n, _env("OMPI_MCA_btl_tcp_if_include", "enP7s7"))),
        Seed("env-unset", "env.unset", "spark2", lambda lab, n: replace_container(
            lab, n, _env("OMPI_MCA_oob_tcp_if_include", None))),
        Seed("ib-hca-missing", "nccl.ib_hca_missing", "spark2", lambda lab, n: replace_container(
            lab, n, _env("NCCL_IB_HCA", "mlx5_0"))),
        Seed("ib-hca-partial", "nccl.ib_hca_partial", "spark1", lambda lab, n: replace_container(
            lab, n, _env("NCCL_IB_HCA", "rocep1s0f1"))),
        # mpi
        Seed("hostfile", "mpi.hostfile_mismatch", "spark2",
             f"docker exec {CONTAINER} sh -c 'echo 10.9.9.9 > /etc/openmpi-hostfile'"),
    ]


@dataclass(frozen=True)
class Fault:
    """A fault a person must close: seeded, found, left alone by --fix (which says so), closed by `manual`."""

    name: str
    node: str
    seed: str
    expect: str
    #: the command (run as root on the node) a person would run
    manual: str
    #: the finding is a warning (the lab stays "healthy"), found all the same
    warning: bool = False
    #: errors the same fault rightly brings along (an older driver on one node also differs from the others')
    along: tuple[str, ...] = ()


def until(condition: str, seconds: int = 60) -> str:
    """Shell: wait until `condition` holds (a listener bound or gone), at most `seconds`; fail if it never does."""
    return f"for _ in $(seq {seconds * 10}); do if {condition}; then exit 0; fi; sleep 0.1; done; exit 1"


def faults() -> list[Fault]:
    return [
        Fault("port-taken", "spark2",
              f"docker stop -t 1 {CONTAINER} >/dev/null; setsid -f python3 -m http.server 2233 >/dev/null 2>&1; "
              + until("ss -ltnH 'sport = :2233' | grep -q ."), "port.taken",
              manual="kill $(ss -ltnpH 'sport = :2233' | sed -n 's/.*pid=\\([0-9]*\\).*/\\1/p'); "
                     + until("! ss -ltnH 'sport = :2233' | grep -q .")),
        Fault("docker-group", "spark1", "gpasswd -d nvidia docker", "node.docker_group",
              manual="usermod -aG docker nvidia"),
        Fault("sudo-password", "spark2", "sed -i 's/NOPASSWD: ALL/ALL/' /etc/sudoers.d/50-lab-nvidia",
              "node.sudo_password", manual="sed -i 's/(ALL:ALL) ALL/(ALL:ALL) NOPASSWD: ALL/' "
                                           "/etc/sudoers.d/50-lab-nvidia"),
        # seeded twice before it is closed, it still keeps the file as it was first (the person's copy)
        Fault("ssh-auth", "spark2", "{ [ -e /root/ak ] || cp /home/nvidia/.ssh/authorized_keys /root/ak; } && "
              "sed -i '/lab-controller/d' /home/nvidia/.ssh/authorized_keys", "node.ssh_auth",
              manual="cp /root/ak /home/nvidia/.ssh/authorized_keys && rm -f /root/ak"),
        Fault("hf-cache-full", "spark1", "mount -t tmpfs -o size=1m tmpfs /home/nvidia/.cache/huggingface",
              "disk.hf_cache_low", manual="umount /home/nvidia/.cache/huggingface", warning=True),
    ]


STANDIN_FAULTS = "/run/lab/standin-faults"  # the lab stand-ins' fault switches (sparkctl/lab/standins/node-bin)


def system_faults() -> list[Fault]:
    """Faults of the nodes' own software (issue 13, section 4), each needing a person: seeded, found, undone by hand.
    RDMA, the GPU driver and the CX-7 firmware are stand-ins in the lab, switched by STANDIN_FAULTS; the files and
    sshd drop-ins are real. Memory, the kernel and the image's env cannot differ between lab nodes (one kernel, one
    image): tests/unit/test_doctor_system.py holds those on recorded outputs."""
    clear = f"rm -f {STANDIN_FAULTS}"
    return [
        Fault("gid-missing", "spark2", f"echo 'gid-missing roceP2p1s0f1' > {STANDIN_FAULTS}", "roce.gid_missing",
              manual=clear),
        Fault("roce-port-inactive", "spark1", f"echo 'port-down rocep1s0f1' > {STANDIN_FAULTS}",
              "roce.port_inactive", manual=clear),
        Fault("firmware-differs", "spark2", f"echo 'fw 28.43.1014' > {STANDIN_FAULTS}", "roce.firmware_mismatch",
              manual=clear),
        # another driver of the branch the image's CUDA 13 needs (580): only the mismatch
        Fault("driver-differs", "spark2", f"echo 'driver 580.65.06' > {STANDIN_FAULTS}", "gpu.driver_mismatch",
              manual=clear),
        # a driver of the CUDA 12.9 branch under the image's CUDA_VERSION=13.0.2 (sparkctl/lab/image.py)
        Fault("driver-too-old", "spark2", f"printf 'driver 575.64.03\\ncuda 12.9\\n' > {STANDIN_FAULTS}",
              "gpu.driver_too_old", manual=clear, along=("gpu.driver_mismatch",)),
        Fault("nccl-conf", "spark1", f"docker exec {CONTAINER} sh -c 'echo NCCL_IB_DISABLE=1 >> /etc/nccl.conf'",
              "env.file_setting", manual=f"docker exec {CONTAINER} rm -f /etc/nccl.conf"),
        Fault("bashrc", "spark2", "echo 'export NCCL_SOCKET_IFNAME=eth0' >> /home/nvidia/.bashrc",
              "env.host_setting", manual="sed -i '/NCCL_SOCKET_IFNAME=eth0/d' /home/nvidia/.bashrc", warning=True),
        Fault("sshd-dropin", "spark1", "printf 'PubkeyAuthentication no\\n' > /etc/ssh/sshd_config.d/50-hardening.conf",
              "ssh.sshd_dropin", manual="rm -f /etc/ssh/sshd_config.d/50-hardening.conf"),
    ]
