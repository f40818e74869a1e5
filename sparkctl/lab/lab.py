"""A lab of simulated DGX Sparks: bring it up, reach into it, tear it down."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import BadInput, SparkctlError
from sparkctl.lab import inventory_writer, network, node, podman, reboot, systemd
from sparkctl.lab.image import IMAGE_STORE, ensure_image, image_ref
from sparkctl.lab.naming import ALL_TWINS, LabNames, new_lab_id, node_name, parse_ring_order, validate_topology
from sparkctl.lab.renderer import DEFAULT_RENDERER, renderer_spec
from sparkctl.lab.state import LabState, NodeRecord, Resource, process_is_alive, process_starttime
from sparkctl.lab.teardown import teardown

DEFAULT_DIR = Path(".sparkctl-lab")
BOOT_TIMEOUT = 90.0
Log = Callable[[str], None]


def _node_standins() -> list[Path]:
    from sparkctl.lab.standins import NODE_STANDINS, standin_path

    return [standin_path(name) for name in NODE_STANDINS]


@dataclass(frozen=True)
class LabNode:
    name: str
    index: int
    mgmt_ip: str
    pid: int | None
    init: str


class Lab:
    def __init__(self, state: LabState):
        self.state = state
        self.dir = Path(state.dir)
        self.names = LabNames(state.lab_id)
        self._launchers: list[subprocess.Popen] = []
        self.cgroup_mounts = node.machine_cgroup_mounts()

    # --- views ---------------------------------------------------------------------------------------
    @property
    def renderer(self):
        return renderer_spec(self.state.renderer)

    @property
    def nodes(self) -> list[LabNode]:
        return [LabNode(n.name, n.index, n.mgmt_ip, n.pid, n.init) for n in self.state.nodes]

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yaml"

    @property
    def key_path(self) -> Path:
        return self.dir / inventory_writer.KEY_NAME

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "known_hosts"

    def paths(self, node_name_: str) -> node.NodePaths:
        return node.NodePaths(self.dir / "nodes" / node_name_)

    def node_cgroup(self, name: str) -> str:
        return f"{self.names.cgroup}/{name}"

    def cgroup_procs_files(self, name: str) -> list[Path]:
        return [node.CGROUP_ROOT / m.mountpoint / self.node_cgroup(name) / "cgroup.procs"
                for m in self.cgroup_mounts]

    def pid_of(self, name: str) -> int:
        record = self.state.node(name)
        if record.pid is None or not process_is_alive(record.pid, None):
            # another process (`sparkctl lab reboot`) may have booted the node again since this state was read
            self.state = LabState.load(self.dir)
            record = self.state.node(name)
        if record.pid is None or not process_is_alive(record.pid, None):
            raise SparkctlError(f"node {name} is not running", hint=f"sparkctl lab up --dir {self.dir}")
        return record.pid

    def node_path(self, name: str, path: str) -> Path:
        """The machine path of a node file: through the running node's root, else its overlay upper dir."""
        record = self.state.node(name)
        if record.pid is not None and process_is_alive(record.pid, None):
            return Path(f"/proc/{record.pid}/root") / path.lstrip("/")
        return self.paths(name).upper_for(path) or Path(path)

    # --- reaching into nodes -------------------------------------------------------------------------
    def exec(self, name: str, argv: list[str] | str, check: bool = False, input: str | None = None,
             timeout: float | None = 120) -> subprocess.CompletedProcess:
        """Run as root on the node (all its namespaces, its cgroup); output captured as text."""
        return node.node_exec(self.pid_of(name), argv, check=check, input=input, timeout=timeout,
                              procs_files=self.cgroup_procs_files(name))

    def ssh_argv(self, name: str, *command: str, user: str = "nvidia") -> list[str]:
        """ssh as the node's user with the lab key, the host key verified against the lab's known_hosts."""
        return ["ssh", "-F", "/dev/null", "-i", str(self.key_path), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts_path}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                f"{user}@{self.state.node(name).mgmt_ip}", *command]

    # --- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    def load(cls, directory: str | Path) -> Lab:
        directory = Path(directory).resolve()
        if not LabState.exists(directory):
            raise BadInput(f"no lab in {directory} (no state.json)", hint="sparkctl lab up")
        return cls(LabState.load(directory))

    @classmethod
    def up(cls, directory: str | Path = DEFAULT_DIR, nodes: int = 2, topology: str = "pair", port: int = 1,
           sudo_password: bool = False, ring_order: str | None = None, renderer: str = DEFAULT_RENDERER,
           log: Log = lambda _msg: None) -> Lab:
        try:
            validate_topology(topology, nodes, port)
            order = parse_ring_order(ring_order, topology, nodes)
            renderer_spec(renderer)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        directory = Path(directory).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        if LabState.exists(directory) and LabState.load(directory).phase != "down":
            raise BadInput(f"a lab is already recorded in {directory}",
                           hint=f"sparkctl lab down --dir {directory}")
        # the container image bootstrap will run: built once (with progress), reused from the shared store after
        ensure_image(log=log)
        lab = cls(LabState(lab_id=_free_lab_id(), dir=str(directory), topology=topology, port=port,
                           sudo_password=sudo_password, ring_order=list(order) if order else None,
                           renderer=renderer))
        lab.state.save()
        try:
            lab._build(nodes, log)
        except BaseException:
            log("bring-up failed; tearing down what was built")
            lab.down()
            raise
        return lab

    def _build(self, count: int, log: Log) -> None:
        started = time.monotonic()
        state, names = self.state, self.names
        shutil.rmtree(self.dir / "nodes", ignore_errors=True)
        for stale in ("inventory.yaml", "known_hosts", "sudo-password"):
            (self.dir / stale).unlink(missing_ok=True)
        _raise_inotify_limit(log)
        key = inventory_writer.write_controller_key(self.dir)
        password = secrets.token_urlsafe(12) if state.sudo_password else None
        if password:
            inventory_writer.write_secret(self.dir / "sudo-password", password)
        state.nodes = [NodeRecord(node_name(i), i, names.mgmt_ip(i)) for i in range(1, count + 1)]
        init = "shell" if os.environ.get("SPARKCTL_LAB_INIT") == "shell" or \
            not Path(systemd.SYSTEMD_BINARY).exists() else "systemd"
        for record in state.nodes:
            record.init = init
        state.record(Resource(kind="cgroup", name=names.cgroup))
        network.add_mgmt_bridge(state, names)
        lab_image, image_store = image_ref(), IMAGE_STORE
        masked = systemd.units_to_mask(systemd.enabled_units(), self.renderer)
        standins = _node_standins()
        for record in state.nodes:
            network.add_netns(state, names.node_netns(record.name))
            network.add_mgmt_link(state, names, record.index, record.name)
            self._prepare_node(record, key.with_suffix(".pub").read_text(), masked, image_store, standins)
        network.build_fabric(state, names, {r.index: r.name for r in state.nodes})
        log(f"lab {names.lab_id}: {count} node(s) wired in {time.monotonic() - started:.1f}s; booting")
        for record in state.nodes:
            self._start_node(record)
        with ThreadPoolExecutor(max_workers=min(16, count)) as pool:
            list(pool.map(self._wait_booted, state.nodes))
        if password:
            for record in state.nodes:
                self.exec(record.name, ["chpasswd"], input=f"nvidia:{password}\n", check=True)
        known = []
        for record in state.nodes:
            host_keys = self.paths(record.name).etc_upper / "ssh"
            known += inventory_writer.known_hosts_lines(record.mgmt_ip, host_keys)
        inventory_writer.write_known_hosts(self.known_hosts_path, known)
        document = inventory_writer.inventory_document(
            self.dir, names.cluster_name, [(r.name, r.mgmt_ip) for r in state.nodes], state.topology,
            state.port, lab_image)
        inventory_writer.write_inventory(self.inventory_path, document)
        state.phase = "up"
        state.save()
        log(f"lab {names.lab_id}: up in {time.monotonic() - started:.1f}s")

    def _prepare_node(self, record: NodeRecord, authorized_key: str, masked: list[str], image_store: str,
                      standins: list[Path]) -> None:
        paths = self.paths(record.name)
        for d in (paths.etc_upper, paths.etc_work, paths.home_upper, paths.home_work, paths.run,
                  paths.tmp, paths.var_tmp, paths.containers, paths.var_lib_sparkctl, paths.bin,
                  *(paths.var_lib / name for name in self.renderer.own_var_lib)):
            d.mkdir(parents=True, exist_ok=True)
        paths.console.touch()
        paths.tmp.chmod(0o1777)
        paths.var_tmp.chmod(0o1777)
        (paths.run / "lab").mkdir()
        (paths.run / "lab").chmod(0o1777)
        node.copy_skel(paths.root_home)
        for script in standins:
            target = paths.bin / script.name
            shutil.copyfile(script, target)
            target.chmod(0o755)
        (paths.base / "authorized_keys").write_text(authorized_key)
        etc = paths.etc_upper
        (etc / "hostname").write_text(f"{record.name}\n")
        machine_hosts = [line for line in Path("/etc/hosts").read_text().splitlines()
                         if not line.startswith("127.0.1.1")]
        (etc / "hosts").write_text("\n".join([*machine_hosts, f"127.0.1.1\t{record.name}"]) + "\n")
        (etc / "machine-id").write_text(secrets.token_hex(16) + "\n")
        (etc / "dgx-release").write_text('DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark (lab)"\n')
        (etc / "netplan").mkdir()
        for name, content in self.renderer.netplan_files(record.mgmt_ip).items():
            netplan = etc / "netplan" / name
            netplan.write_text(content)
            netplan.chmod(0o600)
        sudoers = etc / "sudoers.d"
        sudoers.mkdir()
        rule = "ALL" if self.state.sudo_password else "NOPASSWD: ALL"
        # file order matters: the docker rule must come last so podman never asks for a password
        (sudoers / "50-lab-nvidia").write_text(f"nvidia ALL=(ALL:ALL) {rule}\n")
        (sudoers / "60-lab-docker").write_text(podman.DOCKER_SUDOERS)
        for f in sudoers.iterdir():
            f.chmod(0o440)
        podman.write_podman_config(etc, image_store)
        _write_sshd_pam(etc)
        systemd.write_unit_config(etc, masked, self.renderer)
        paths.init_script.write_text(
            node.render_init_script(paths, record.name, self.cgroup_mounts, record.init, self.renderer))

    def _start_node(self, record: NodeRecord) -> None:
        paths = self.paths(record.name)
        cgroup = self.node_cgroup(record.name)
        procs = node.create_cgroup(cgroup, self.cgroup_mounts)
        launcher = node.start(self.names.node_netns(record.name), paths, procs)
        self._launchers.append(launcher)
        self.state.record(Resource(kind="process", name=str(launcher.pid), node=record.name,
                                   starttime=process_starttime(launcher.pid)))
        deadline = time.monotonic() + 10
        while (pid := node.child_pid(launcher.pid)) is None:
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise SparkctlError(f"node {record.name} did not start",
                                    hint=f"see {paths.console_log}")
            time.sleep(0.01)
        record.pid = pid
        self.state.record(Resource(kind="process", name=str(pid), node=record.name,
                                   starttime=process_starttime(pid)))

    def _wait_booted(self, record: NodeRecord) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        paths = self.paths(record.name)
        if record.init == "systemd":
            while True:
                if record.pid is None or not process_is_alive(record.pid, None):
                    tail = paths.console_log.read_text(errors="replace").strip().splitlines()[-1:]
                    raise SparkctlError(f"node {record.name} died while booting: {' '.join(tail)}",
                                        hint=f"see {paths.console_log}")
                result = self.exec(record.name, ["systemctl", "is-system-running", "--wait"],
                                   timeout=BOOT_TIMEOUT)
                if systemd.booted(result.stdout):
                    break
                if time.monotonic() > deadline:
                    raise SparkctlError(f"node {record.name} did not boot: {result.stdout.strip()}",
                                        hint=f"sparkctl lab exec {record.name} -- systemctl --failed")
                time.sleep(0.2)
        while not _port_open(record.mgmt_ip, 22):
            if time.monotonic() > deadline:
                raise SparkctlError(f"sshd on {record.name} ({record.mgmt_ip}:22) did not answer")
            time.sleep(0.05)

    def reboot(self, name: str, hard: bool = False, log: Log = lambda _msg: None) -> float:
        """Power NAME off (cleanly, or `hard`: a power cut), lose what lives in memory, boot it again; returns the
        seconds until its sshd answered (sparkctl/lab/reboot.py)."""
        record = self.state.node(name)
        started = time.monotonic()
        reboot.power_off(self, name, hard)
        reboot.forget_memory(self, name)
        log(f"{name}: {'power cut' if hard else 'shut down'}; booting")
        self._start_node(record)
        self.state.save()
        self._wait_booted(record)
        return time.monotonic() - started

    def down(self, log: Log = lambda _msg: None) -> list[str]:
        """Tear everything down; returns what could not be removed (empty on success)."""
        leftovers = teardown(self, log)
        for launcher in self._launchers:
            try:
                launcher.wait(timeout=5)
            except subprocess.TimeoutExpired:
                leftovers.append(f"launcher {launcher.pid} did not exit")
        self.state.phase = "down"
        self.state.save()
        return leftovers

    # --- status --------------------------------------------------------------------------------------
    def fabric_up(self, name: str) -> list[str]:
        """The node's fabric twins that have carrier, in ibdev2netdev order."""
        netns = self.names.node_netns(name)
        return [t for t in ALL_TWINS if network.link_state(netns, t).get("operstate") == "UP"]

    def status(self) -> list[dict]:
        rows = []
        for record in self.state.nodes:
            running = record.pid is not None and process_is_alive(record.pid, None)
            system = ""
            if running and record.init == "systemd":
                system = self.exec(record.name, ["systemctl", "is-system-running"], timeout=10).stdout.strip()
            rows.append({"node": record.name, "mgmt_ip": record.mgmt_ip,
                         "pid": record.pid if running else None, "init": record.init,
                         "system": system if running else "down",
                         "fabric_up": self.fabric_up(record.name) if running else []})
        return rows


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
WANTED_INOTIFY_INSTANCES = 8192


def _raise_inotify_limit(log: Log) -> None:
    """Each node's systemd, journald, networkd, logind and dbus hold ~10 inotify instances, all as root.

    The default limit (128 per user) is spent by about a dozen nodes across all labs; the next systemd
    then dies at start ("Failed to allocate manager object", exit 255). Only ever raised.
    """
    try:
        current = int(INOTIFY_INSTANCES.read_text())
        if current < WANTED_INOTIFY_INSTANCES:
            INOTIFY_INSTANCES.write_text(str(WANTED_INOTIFY_INSTANCES))
            log(f"raised fs.inotify.max_user_instances {current} -> {WANTED_INOTIFY_INSTANCES}")
    except OSError as exc:
        log(f"could not raise fs.inotify.max_user_instances: {exc}")


def _write_sshd_pam(etc_upper: Path) -> None:
    """sshd sessions leave loginuid unset on a node.

    With Docker, containers start from a daemon, so their processes have no loginuid and the container's
    own sshd may set one. The lab's podman starts containers from the user's ssh session instead; an
    inherited loginuid then makes pam_loginuid in the container's sshd refuse every session (mpirun:
    "ORTE was unable to reliably start one or more daemons").
    """
    machine = Path("/etc/pam.d/sshd")
    if not machine.is_file():
        return
    lines = ["# sparkctl lab: " + line if "pam_loginuid.so" in line and not line.lstrip().startswith("#")
             else line for line in machine.read_text().splitlines()]
    (etc_upper / "pam.d").mkdir(exist_ok=True)
    (etc_upper / "pam.d" / "sshd").write_text("\n".join(lines) + "\n")


def _free_lab_id() -> str:
    taken = network.existing_netns()
    for _ in range(100):
        names = LabNames(new_lab_id())
        if any(ns.startswith(f"sl{names.lab_id}-") for ns in taken):
            continue
        if names.bridge in network.existing_links():
            continue
        if not network.subnet_in_use(names.mgmt_subnet):
            return names.lab_id
    raise SparkctlError("could not find a free lab id (too many labs on this machine?)")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
