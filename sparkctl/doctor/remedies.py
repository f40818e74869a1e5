"""Every doctor finding id closes: the bootstrap tasks that repair it (`doctor --fix` runs them, a bootstrap rerun
does too), or the reason a person must act (a cable, a password, a disk...), said in the finding.

Adding a finding id means adding it here; tests/unit/test_doctor_remedies.py reads every id the code can produce
and fails on one that is missing, and `sparkctl doctor --list` / playbooks.md print this table.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What a person deals with when sparkctl cannot: kind -> how the table and the findings name it.
KINDS: dict[str, str] = {
    "cable": "a cable or a port",
    "hardware": "the machine itself (power, driver, hardware)",
    "firmware": "firmware or a driver release",
    "password": "a password or a key only you hold",
    "account": "an account or a permission",
    "disk": "disk space",
    "process": "a process sparkctl did not start",
    "inventory": "a choice in the inventory",
    "software": "software sparkctl does not install",
    "site": "the site's network (a switch, a firewall, time servers)",
    "note": "nothing to repair",
    "sparkctl": "a bug in sparkctl",
}

NETWORK = ("network.netplan", "network.verify")
SSH = ("ssh.keys", "ssh.mesh", "ssh.verify")
CONTAINER = ("container", "mpi")


@dataclass(frozen=True)
class Remedy:
    """How a finding closes. Exactly one of `tasks` (bootstrap task or phase names) and `person` (why sparkctl
    cannot repair it, and so what a person does) is set; `kind` (a key of KINDS) goes with `person`."""

    about: str
    tasks: tuple[str, ...] = ()
    person: str = ""
    kind: str = ""

    def __post_init__(self) -> None:
        if bool(self.tasks) == bool(self.person):
            raise ValueError(f"a remedy has tasks or a person's reason, exactly one: {self}")
        if self.person and self.kind not in KINDS:
            raise ValueError(f"kind must be one of {sorted(KINDS)}, not {self.kind!r}")

    @property
    def repairable(self) -> bool:
        return bool(self.tasks)

    @property
    def closed_by(self) -> dict:
        """As --json says it: {"tasks": [...]} or {"person": kind, "why": ...}."""
        return {"tasks": list(self.tasks)} if self.tasks else {"person": self.kind, "why": self.person}

    @property
    def needs_person(self) -> str:
        """The reason, as a finding says it: 'needs you (a cable or a port): ...'."""
        return f"needs you ({KINDS[self.kind]}): {self.person}" if self.person else ""


def _by(about: str, *tasks: str) -> Remedy:
    return Remedy(about, tasks=tasks)


def _person(about: str, kind: str, why: str) -> Remedy:
    return Remedy(about, person=why, kind=kind)


REMEDIES: dict[str, Remedy] = {
    # node: reaching and using the machine
    "node.unreachable": _person("the node does not answer over SSH", "hardware",
                                "sparkctl reaches nodes only over SSH: power the node on and connect it"),
    "node.not_ssh": _person("the node's SSH port accepts connections and closes them (not an SSH server)", "site",
                            "something other than sshd answers there (or a gateway in front of a node that is "
                            "down): only the site can tell which"),
    "node.ssh_refused": _person("nothing listens on the node's SSH port", "software",
                                "sparkctl reaches nodes only over SSH: start sshd on the node, or fix the port in "
                                "the inventory"),
    "node.ssh_auth": _person("the node refuses the controller's SSH key", "password",
                             "installing the key needs the node's password (ssh-copy-id), which sparkctl never asks"),
    "node.host_key_changed": _person("the node's SSH host key changed", "password",
                                     "only a person can tell a reinstall from an impostor; then ssh-keygen -R"),
    "node.user_mismatch": _person("logged in as another user than the inventory names", "inventory",
                                  "which account to use is the inventory's choice (or create the account)"),
    "node.sudo_password": _person("sudo asks for a password that was not given", "password",
                                  "the sudo password is yours: --ask-become-pass, or allow passwordless sudo"),
    "node.docker_missing": _person("docker is not installed", "software",
                                   "DGX OS ships docker and the NVIDIA runtime; sparkctl does not install them"),
    "node.docker_group": _person("the user may not use docker", "account",
                                 "the docker group is root on the node: granting it is a person's decision"),
    "node.docker_broken": _person("docker fails for another reason than a permission", "software",
                                  "a broken docker daemon, storage or runtime is repaired from `docker info`"),
    "node.not_spark": _person("not recognised as a DGX Spark", "note",
                              "a note: sparkctl goes on with any Linux node"),
    "node.facts_partial": _person("some facts could not be read", "hardware",
                                  "the evidence names the command that failed on the node; see why there"),
    "node.clock_skew": _person("the clock is off from the other nodes", "site",
                               "time servers are the site's: enable NTP (timedatectl set-ntp true) against them"),
    "node.low_memory": _person("little memory is free", "process",
                               "something else holds the memory; sparkctl stops only what it started"),
    "node.page_cache": _person("a large page cache competes with the GPU", "process",
                               "dropping caches slows every other program on the node: a person chooses when"),
    "node.cma_reserved": _person("a CMA area leaves the model too little memory", "hardware",
                                 "the cma= boot parameter is the kernel command line's: change it and reboot"),
    "node.swap_in_use": _person("the node is swapping", "process",
                                "something else holds the memory; sparkctl stops only what it started"),
    "node.kernel_mismatch": _person("the kernel differs from the other nodes'", "firmware",
                                    "an OS update and a reboot, node by node, are a person's to schedule"),
    "gpu.driver_too_old": _person("the GPU driver is older than the image's CUDA needs", "firmware",
                                  "a driver update (and reboot), or an image built for this driver"),
    "gpu.driver_mismatch": _person("the GPU driver differs from the other nodes'", "firmware",
                                   "a driver update and a reboot are a person's to schedule"),
    "disk.hf_cache_low": _person("little disk space left in the HF cache", "disk",
                                 "free space or point container.hf_cache at a bigger disk"),
    "image.known_bad_release": _person("the image's TensorRT-LLM release has known multi-node problems",
                                       "inventory", "the release is the inventory's choice (container.image)"),
    # fabric
    "fabric.port_down": _by("a planned fabric twin is administratively down (Up is part of the planned state)",
                            *NETWORK),
    "fabric.interface_missing": _person("a planned fabric interface does not exist", "hardware",
                                        "the CX-7 driver or card (`ibdev2netdev`), or pin fabric.interfaces"),
    "fabric.no_carrier": _person("a planned fabric twin has no carrier while both ends are up", "cable",
                                 "the cable or the port: reseat or replace the QSFP cable"),
    "fabric.wrong_port": _person("the cable is in another port than the inventory plans", "cable",
                                 "move the cable, or set fabric.port: auto in the inventory"),
    "fabric.ports_differ": _person("the nodes use different QSFP ports", "note",
                                   "works (each node uses its own names); NVIDIA recommends the same port"),
    "fabric.speed_low": _person("a fabric link runs below 200 Gb/s", "cable",
                                "the cable or the switch port negotiated a lower speed"),
    "fabric.bandwidth_regression": _person(
        "the last fabric bench is slower than the first (or the last) one", "cable",
        "the bench's causes name what changed (a renegotiated cable or port, a shaper, PCIe width, MTU); sparkctl "
        "measures the link but cannot reseat a cable or update firmware: fix it, then `fabric bench` again"),
    "fabric.no_plan": _person("no fabric plan can be made from what is cabled", "cable",
                              "no QSFP port is Up on a node: plug the cable into the same port on both nodes"),
    "fabric.cable_wrong": _person("LLDP sees a cable where the inventory wants another", "cable",
                                  "move the cable, or (a ring) reorder nodes: as `sparkctl inventory init` proposes"),
    "fabric.lldp_unavailable": _person("the cabling map is inferred for a node (its lldpd cannot be read)", "note",
                                       "installing lldpd (it announces the node on every link) is a person's choice"),
    "roce.port_inactive": _person("a RoCE device is not ACTIVE while its netdev is Up", "hardware",
                                  "the CX-7 driver or the port itself (`dmesg | grep mlx5`)"),
    "roce.gid_missing": _person("a twin's RoCE device has no RoCE v2 GID on its address", "hardware",
                                "the kernel builds the GID table; re-adding the address or reloading mlx5 rebuilds it"),
    "roce.firmware_mismatch": _person("the CX-7 firmware differs from the other nodes'", "firmware",
                                      "a firmware update and a reboot are a person's to schedule"),
    "fabric.address_missing": _by("a fabric twin lacks its planned address", *NETWORK),
    "fabric.address_extra": _by("a fabric twin has a second address in its subnet", *NETWORK),
    "fabric.address_foreign": _by("a fabric twin has an address outside its subnet", *NETWORK),
    "fabric.address_duplicate": _by("one fabric address is used twice", *NETWORK),
    "fabric.link_local": _by("a link-local address is left on a fabric twin", *NETWORK),
    "fabric.twins_same_subnet": _by("two fabric twins share one subnet (the legacy scheme)", *NETWORK),
    "fabric.mtu_mismatch": _by("a fabric twin's MTU is not the planned one", *NETWORK),
    "fabric.jumbo_ping": _person("jumbo frames do not cross a link whose ends are set right", "site",
                                 "an MTU below 9000 on the path: the switch ports need MTU 9216"),
    "fabric.link_dead": _person("no answer across a link whose ends are set right", "site",
                                "the cable, a firewall or the switch between them"),
    "netplan.conflict": _by("another netplan file also configures the fabric", *NETWORK),
    "netplan.drift": _by("the fabric netplan file is missing or differs from the plan", *NETWORK),
    "nm.competing_profile": _by("a NetworkManager profile would take a fabric twin from netplan's", *NETWORK),
    "nm.twin_unmanaged": _by("NetworkManager renders a fabric twin but does not manage it", *NETWORK),
    "nm.unread": _person("nmcli did not say in time what state NetworkManager is in", "note",
                         "nothing is known broken: run doctor again; `nmcli device status` on the node shows "
                         "whether it answers"),
    "nm.not_running": _person("NetworkManager renders the fabric but is not running", "software",
                              "sparkctl does not run the node's services: sudo systemctl enable --now NetworkManager"),
    # ssh
    "ssh.mesh_broken": _by("a node cannot ssh to a peer without a password", *SSH),
    "ssh.sshd_dropin": _person("an sshd drop-in breaks the node-to-node ssh mesh", "account",
                               "sshd's own configuration is the node owner's: sparkctl does not edit it"),
    "ssh.mesh_unchecked": _person("a node-to-node ssh could not be tried (the peer's sshd reset or timed out the "
                                  "handshake)", "note", "nothing is known broken: run doctor again; if it stays, "
                                  "look at the peer's load and sshd's MaxStartups"),
    # container
    "env.image_setting": _person("the image sets an NCCL/UCX/Open MPI variable sparkctl does not", "inventory",
                                 "the value to use is the inventory's choice: container.env overrides the image"),
    "env.file_setting": _person("a file in the container sets an NCCL/UCX/Open MPI variable", "software",
                                "the file belongs to the image: sparkctl does not edit files it did not write"),
    "env.host_setting": _person("a node's startup file sets an NCCL/UCX/Open MPI variable", "software",
                                "the node user's own files: sparkctl does not edit files it did not write"),
    "port.taken": _person("a port sparkctl needs is taken by another process", "process",
                          "sparkctl stops only what it started: stop that process or choose another port"),
    "container.missing": _by("the container does not exist", *CONTAINER),
    "container.exited": _by("the container is not running", *CONTAINER),
    "container.restarting": _by("the container keeps restarting", *CONTAINER),
    "container.spec_drift": _by("the container differs from the plan", *CONTAINER),
    "container.ssh_broken": _by("ssh between the containers fails", "container.state", "container.ssh"),
    "container.ssh_unchecked": _person("a container-to-container ssh could not be tried (the peer's sshd reset or "
                                       "timed out the handshake)", "note", "nothing is known broken: run doctor "
                                       "again; if it stays, look at the peer's load"),
    "container.unread": _person("docker did not say in time what state the container is in", "note",
                                "nothing is known broken: run doctor again; `docker ps` on the node shows whether "
                                "docker answers"),
    "container.ssh_exposed": _by("the container's sshd answers on the management address", *CONTAINER),
    "env.iface_absent": _by("a container interface setting names an interface the node lacks", *CONTAINER),
    "env.iface_down": _by("a container interface setting names a Down interface", *CONTAINER),
    "env.management_iface": _by("a container interface setting names the management interface", *CONTAINER),
    "env.unset": _by("a container interface setting is unset", *CONTAINER),
    "nccl.ib_hca_missing": _by("NCCL_IB_HCA names no RoCE device of the node", *CONTAINER),
    "nccl.ib_hca_partial": _by("NCCL_IB_HCA leaves out a twin's RoCE device", *CONTAINER),
    "vllm.wrong_nic": _by("a vLLM rank's own address or control interface (VLLM_HOST_IP, GLOO/TP_SOCKET_IFNAME) is "
                          "not its node's Up fabric twin", *CONTAINER),
    "vllm.ranks_one_node": _by("two vLLM ranks look like one node (the same VLLM_HOST_IP)", "container", "serve"),
    "vllm.ray_missing": _person("Ray is vLLM's executor and the image has no Ray", "inventory",
                                "choose an image with Ray or serve.vllm.executor: mp in the inventory"),
    "vllm.master_unreachable": _person("a vLLM worker cannot reach the master port on the head over the fabric",
                                       "site", "a link or a firewall between the nodes drops it: sparkctl writes "
                                       "no firewall rules"),
    "vllm.flag_refused": _person("the image's vLLM release refuses a flag of the launch", "inventory",
                                 "the flag is the inventory's (serve.args, serve.config): fix it there"),
    # mpi
    "mpi.hostfile_mismatch": _by("the container's hostfile does not match the nodes' addresses", "mpi"),
    # model and serve
    "model.absent": _by("a checkpoint is not in the HF cache", "model"),
    "model.incomplete": _by("a checkpoint is only partly downloaded", "model"),
    "hf.token_missing": _by("no Hugging Face token on the node (export it; model.token writes it)", "model"),
    "serve.down": _by("nothing serves on the serve port", "serve"),
    "serve.health": _by("the server does not answer /health or a completion", "serve"),
    "serve.unit_missing": _by("the unit that keeps the model served is not installed on the head", "serve"),
    "serve.unit_failed": _by("the serving unit failed and does not start the server again", "serve"),
    "serve.unit_looping": _by("the serving unit keeps starting the server and it keeps ending", "serve"),
    "serve.unit_disabled": _person("the serving unit is disabled (`sparkctl serve stop`): nothing is served, also "
                                   "after a reboot", "note", "it was stopped on purpose: a serving bootstrap "
                                   "(`sparkctl cluster bootstrap FILE`) serves again"),
    "serve.gateway_down": _by("the gateway in front of the engine does not run or listen where it should", "serve"),
    "serve.degenerate": _person("the server answers with degenerate output", "inventory",
                                "a release with the Eagle3 SM12x fix, or serve.decoding: none, is the inventory's"),
    "nccl.socket_fallback": _by("NCCL ran over TCP sockets, not RDMA", *CONTAINER, "serve"),
    "nccl.warn": _person("NCCL warned in the serve log", "software",
                         "the warning's own words say what NCCL met; read the serve log around it"),
    # doctor itself
    "doctor.run_in_progress": _person("another run held the cluster lock while doctor looked", "note",
                                      "nothing to repair: look again once that run has ended"),
    "doctor.outside_unreadable": _person("a node outside --limit could not be read", "hardware",
                                         "bring the node back (power, network, sshd), then diagnose again"),
    "doctor.check_failed": _person("a doctor check crashed", "sparkctl",
                                   "please report it with `sparkctl doctor --bundle`"),
}


def remedy_of(finding_id: str) -> Remedy | None:
    return REMEDIES.get(finding_id)


def tasks_for_id(finding_id: str) -> tuple[str, ...]:
    remedy = REMEDIES.get(finding_id)
    return remedy.tasks if remedy else ()


def remedies_markdown() -> str:
    """The table, id -> the tasks that repair it or why a person must (playbooks.md, `doctor --list`)."""
    out = ["| finding | what it means | closed by |", "|---|---|---|"]
    for finding_id, r in sorted(REMEDIES.items()):
        closed = ("repaired by " + ", ".join(f"`{t}`" for t in r.tasks)) if r.tasks else \
            f"needs you ({KINDS[r.kind]}): {r.person}"
        out.append(f"| `{finding_id}` | {r.about} | {closed} |")
    return "\n".join(out) + "\n"
