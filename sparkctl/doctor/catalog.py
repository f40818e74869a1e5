"""Every doctor finding id, one FindingType each: what it means, how grave, its phase, and how it closes (the
bootstrap tasks that repair it: `doctor --fix` runs them, a bootstrap rerun does too; or the reason a person must
act: a cable, a password, a disk...). Checks make their findings by calling these objects; `doctor --list`,
playbooks.md, the fix lines and tests/unit/test_doctor_remedies.py all read this one table.

Adding a finding id means adding its object here (docs/architecture.md, "Adding a doctor check").
"""

from __future__ import annotations

from sparkctl.doctor.findings import KINDS, FindingType, Phase, Severity
from sparkctl.knowledge.certificates import EXPIRY_WARNING_DAYS

NETWORK = ("network.netplan", "network.verify")
SSH = ("ssh.keys", "ssh.mesh", "ssh.verify")
CONTAINER = ("container", "mpi")


def _by(finding_id: str, severity: Severity, phase: Phase, about: str, *tasks: str) -> FindingType:
    return FindingType(finding_id, severity, phase, about, tasks=tasks)


def _person(finding_id: str, severity: Severity, phase: Phase, about: str, kind: str, why: str) -> FindingType:
    return FindingType(finding_id, severity, phase, about, person=why, kind=kind)


# node: reaching and using the machine
NODE_UNREACHABLE = _person("node.unreachable", "error", "node", "the node does not answer over SSH", "hardware",
                           "sparkctl reaches nodes only over SSH: power the node on and connect it")
NODE_NOT_SSH = _person("node.not_ssh", "error", "node", "the node's SSH port accepts connections and closes them "
                       "(not an SSH server)", "site", "something other than sshd answers there (or a gateway in "
                       "front of a node that is down): only the site can tell which")
NODE_SSH_REFUSED = _person("node.ssh_refused", "error", "node", "nothing listens on the node's SSH port", "software",
                           "sparkctl reaches nodes only over SSH: start sshd on the node, or fix the port in the "
                           "inventory")
NODE_SSH_AUTH = _person("node.ssh_auth", "error", "node", "the node refuses the controller's SSH key", "password",
                        "installing the key needs the node's password (ssh-copy-id), which sparkctl never asks")
NODE_HOST_KEY_CHANGED = _person("node.host_key_changed", "error", "node", "the node's SSH host key changed", "password",
                                "only a person can tell a reinstall from an impostor; then ssh-keygen -R")
NODE_USER_MISMATCH = _person("node.user_mismatch", "error", "preflight", "logged in as another user than the "
                             "inventory names", "inventory", "which account to use is the inventory's choice (or "
                             "create the account)")
NODE_SUDO_PASSWORD = _person("node.sudo_password", "error", "preflight", "sudo asks for a password that was not given",
                             "password", "the sudo password is yours: --ask-become-pass, or allow passwordless sudo")
NODE_DOCKER_MISSING = _person("node.docker_missing", "error", "preflight", "docker is not installed", "software",
                              "DGX OS ships docker and the NVIDIA runtime; sparkctl does not install them")
NODE_DOCKER_GROUP = _person("node.docker_group", "error", "preflight", "the user may not use docker", "account",
                            "the docker group is root on the node: granting it is a person's decision")
NODE_DOCKER_BROKEN = _person("node.docker_broken", "error", "preflight", "docker fails for another reason than a "
                             "permission", "software", "a broken docker daemon, storage or runtime is repaired from "
                             "`docker info`")
NODE_NOT_SPARK = _person("node.not_spark", "info", "preflight", "not recognised as a DGX Spark", "note", "a note: "
                         "sparkctl goes on with any Linux node")
NODE_FACTS_PARTIAL = _person("node.facts_partial", "warning", "preflight", "some facts could not be read", "hardware",
                             "the evidence names the command that failed on the node; see why there")
NODE_CLOCK_SKEW = _person("node.clock_skew", "warning", "node", "the clock is off from the other nodes", "site",
                          "time servers are the site's: enable NTP (timedatectl set-ntp true) against them")
NODE_LOW_MEMORY = _person("node.low_memory", "warning", "node", "little memory is free", "process", "something else "
                          "holds the memory; sparkctl stops only what it started")
NODE_PAGE_CACHE = _person("node.page_cache", "warning", "model", "a large page cache competes with the GPU", "process",
                          "dropping caches slows every other program on the node: a person chooses when")
NODE_CMA_RESERVED = _person("node.cma_reserved", "warning", "model", "a CMA area leaves the model too little memory",
                            "hardware", "the cma= boot parameter is the kernel command line's: change it and reboot")
NODE_SWAP_IN_USE = _person("node.swap_in_use", "warning", "model", "the node is swapping", "process", "something "
                           "else holds the memory; sparkctl stops only what it started")
NODE_KERNEL_MISMATCH = _person("node.kernel_mismatch", "warning", "preflight", "the kernel differs from the other "
                               "nodes'", "firmware", "an OS update and a reboot, node by node, are a person's to "
                               "schedule")
GPU_DRIVER_TOO_OLD = _person("gpu.driver_too_old", "error", "container", "the GPU driver is older than the image's "
                             "CUDA needs", "firmware", "a driver update (and reboot), or an image built for this "
                             "driver")
GPU_DRIVER_MISMATCH = _person("gpu.driver_mismatch", "error", "preflight", "the GPU driver differs from the other "
                              "nodes'", "firmware", "a driver update and a reboot are a person's to schedule")
DISK_HF_CACHE_LOW = _person("disk.hf_cache_low", "warning", "model", "little disk space left in the HF cache", "disk",
                            "free space or point container.hf_cache at a bigger disk")
IMAGE_KNOWN_BAD_RELEASE = _person("image.known_bad_release", "warning", "container", "the image's TensorRT-LLM "
                                  "release has known multi-node problems", "inventory", "the release is the "
                                  "inventory's choice (container.image)")

# fabric
FABRIC_PORT_DOWN = _by("fabric.port_down", "error", "network", "a planned fabric twin is administratively down (Up "
                       "is part of the planned state)", *NETWORK)
FABRIC_INTERFACE_MISSING = _person("fabric.interface_missing", "error", "network", "a planned fabric interface does "
                                   "not exist", "hardware", "the CX-7 driver or card (`ibdev2netdev`), or pin "
                                   "fabric.interfaces")
FABRIC_NO_CARRIER = _person("fabric.no_carrier", "error", "network", "a planned fabric twin has no carrier while "
                            "both ends are up", "cable", "the cable or the port: reseat or replace the QSFP cable")
FABRIC_WRONG_PORT = _person("fabric.wrong_port", "error", "network", "the cable is in another port than the "
                            "inventory plans", "cable", "move the cable, or set fabric.port: auto in the inventory")
FABRIC_PORTS_DIFFER = _person("fabric.ports_differ", "info", "network", "the nodes use different QSFP ports", "note",
                              "works (each node uses its own names); NVIDIA recommends the same port")
FABRIC_SPEED_LOW = _person("fabric.speed_low", "warning", "network", "a fabric link runs below 200 Gb/s", "cable",
                           "the cable or the switch port negotiated a lower speed")
FABRIC_BANDWIDTH_REGRESSION = _person("fabric.bandwidth_regression", "warning", "verify", "the last fabric bench is "
                                      "slower than the first (or the last) one", "cable", "the bench's causes name "
                                      "what changed (a renegotiated cable or port, a shaper, PCIe width, MTU); "
                                      "sparkctl measures the link but cannot reseat a cable or update firmware: fix "
                                      "it, then `fabric bench` again")
FABRIC_NO_PLAN = _person("fabric.no_plan", "error", "network", "no fabric plan can be made from what is cabled",
                         "cable", "no QSFP port is Up on a node: plug the cable into the same port on both nodes")
FABRIC_CABLE_WRONG = _person("fabric.cable_wrong", "error", "preflight", "LLDP sees a cable where the inventory "
                             "wants another", "cable", "move the cable, or (a ring) reorder nodes: as `sparkctl "
                             "inventory init` proposes")
FABRIC_LLDP_UNAVAILABLE = _person("fabric.lldp_unavailable", "info", "preflight", "the cabling map is inferred for a "
                                  "node (its lldpd cannot be read)", "note", "installing lldpd (it announces the "
                                  "node on every link) is a person's choice")
ROCE_PORT_INACTIVE = _person("roce.port_inactive", "error", "network", "a RoCE device is not ACTIVE while its netdev "
                             "is Up", "hardware", "the CX-7 driver or the port itself (`dmesg | grep mlx5`)")
ROCE_GID_MISSING = _person("roce.gid_missing", "error", "network", "a twin's RoCE device has no RoCE v2 GID on its "
                           "address", "hardware", "the kernel builds the GID table; re-adding the address or "
                           "reloading mlx5 rebuilds it")
ROCE_FIRMWARE_MISMATCH = _person("roce.firmware_mismatch", "error", "preflight", "the CX-7 firmware differs from the "
                                 "other nodes'", "firmware", "a firmware update and a reboot are a person's to "
                                 "schedule")
FABRIC_ADDRESS_MISSING = _by("fabric.address_missing", "error", "network", "a fabric twin lacks its planned address",
                             *NETWORK)
FABRIC_ADDRESS_EXTRA = _by("fabric.address_extra", "error", "network", "a fabric twin has a second address in its "
                           "subnet", *NETWORK)
FABRIC_ADDRESS_FOREIGN = _by("fabric.address_foreign", "error", "network", "a fabric twin has an address outside its "
                             "subnet", *NETWORK)
FABRIC_ADDRESS_DUPLICATE = _by("fabric.address_duplicate", "error", "network", "one fabric address is used twice",
                               *NETWORK)
FABRIC_LINK_LOCAL = _by("fabric.link_local", "error", "network", "a link-local address is left on a fabric twin",
                        *NETWORK)
FABRIC_TWINS_SAME_SUBNET = _by("fabric.twins_same_subnet", "error", "network", "two fabric twins share one subnet "
                               "(the legacy scheme)", *NETWORK)
FABRIC_MTU_MISMATCH = _by("fabric.mtu_mismatch", "error", "network", "a fabric twin's MTU is not the planned one",
                          *NETWORK)
FABRIC_JUMBO_PING = _person("fabric.jumbo_ping", "error", "network", "jumbo frames do not cross a link whose ends "
                            "are set right", "site", "an MTU below 9000 on the path: the switch ports need MTU 9216")
FABRIC_LINK_DEAD = _person("fabric.link_dead", "error", "network", "no answer across a link whose ends are set right",
                           "site", "the cable, a firewall or the switch between them")
NETPLAN_CONFLICT = _by("netplan.conflict", "error", "network", "another netplan file also configures the fabric",
                       *NETWORK)
NETPLAN_DRIFT = _by("netplan.drift", "error", "network", "the fabric netplan file is missing or differs from the plan",
                    *NETWORK)
NM_COMPETING_PROFILE = _by("nm.competing_profile", "error", "network", "a NetworkManager profile would take a fabric "
                           "twin from netplan's", *NETWORK)
NM_TWIN_UNMANAGED = _by("nm.twin_unmanaged", "error", "network", "NetworkManager renders a fabric twin but does not "
                        "manage it", *NETWORK)
NM_UNREAD = _person("nm.unread", "warning", "network", "nmcli did not say in time what state NetworkManager is in",
                    "note", "nothing is known broken: run doctor again; `nmcli device status` on the node shows "
                    "whether it answers")
NM_NOT_RUNNING = _person("nm.not_running", "error", "network", "NetworkManager renders the fabric but is not running",
                         "software", "sparkctl does not run the node's services: sudo systemctl enable --now "
                         "NetworkManager")

# ssh
SSH_MESH_BROKEN = _by("ssh.mesh_broken", "error", "ssh", "a node cannot ssh to a peer without a password", *SSH)
SSH_SSHD_DROPIN = _person("ssh.sshd_dropin", "error", "ssh", "an sshd drop-in breaks the node-to-node ssh mesh",
                          "account", "sshd's own configuration is the node owner's: sparkctl does not edit it")
SSH_MESH_UNCHECKED = _person("ssh.mesh_unchecked", "warning", "ssh", "a node-to-node ssh could not be tried (the "
                             "peer's sshd reset or timed out the handshake)", "note", "nothing is known broken: run "
                             "doctor again; if it stays, look at the peer's load and sshd's MaxStartups")

# container
ENV_IMAGE_SETTING = _person("env.image_setting", "error", "container", "the image sets an NCCL/UCX/Open MPI variable "
                            "sparkctl does not", "inventory", "the value to use is the inventory's choice: "
                            "container.env overrides the image")
ENV_FILE_SETTING = _person("env.file_setting", "error", "container", "a file in the container sets an NCCL/UCX/Open "
                           "MPI variable", "software", "the file belongs to the image: sparkctl does not edit files "
                           "it did not write")
ENV_HOST_SETTING = _person("env.host_setting", "warning", "container", "a node's startup file sets an NCCL/UCX/Open "
                           "MPI variable", "software", "the node user's own files: sparkctl does not edit files it "
                           "did not write")
PORT_TAKEN = _person("port.taken", "error", "container", "a port sparkctl needs is taken by another process", "process",
                     "sparkctl stops only what it started: stop that process or choose another port")
CONTAINER_MISSING = _by("container.missing", "error", "container", "the container does not exist", *CONTAINER)
CONTAINER_EXITED = _by("container.exited", "error", "container", "the container is not running", *CONTAINER)
CONTAINER_RESTARTING = _by("container.restarting", "error", "container", "the container keeps restarting", *CONTAINER)
CONTAINER_SPEC_DRIFT = _by("container.spec_drift", "error", "container", "the container differs from the plan",
                           *CONTAINER)
CONTAINER_SSH_BROKEN = _by("container.ssh_broken", "error", "container", "ssh between the containers fails",
                           "container.state", "container.ssh")
CONTAINER_SSH_UNCHECKED = _person("container.ssh_unchecked", "warning", "container", "a container-to-container ssh "
                                  "could not be tried (the peer's sshd reset or timed out the handshake)", "note",
                                  "nothing is known broken: run doctor again; if it stays, look at the peer's load")
CONTAINER_UNREAD = _person("container.unread", "warning", "container", "docker did not say in time what state the "
                           "container is in", "note", "nothing is known broken: run doctor again; `docker ps` on the "
                           "node shows whether docker answers")
NODE_EXPOSED_PORT = _by("node.exposed_port", "error", "network", "a listener answers on the node's management "
                        "network that is not meant to (an engine's, MPI's or Ray's port, a server started by hand; "
                        "a warning with `firewall: off`)", "network.firewall")
CONTAINER_SSH_EXPOSED = _by("container.ssh_exposed", "error", "container", "the container's sshd answers on the "
                            "management address", *CONTAINER)
ENV_IFACE_ABSENT = _by("env.iface_absent", "error", "container", "a container interface setting names an interface "
                       "the node lacks", *CONTAINER)
ENV_IFACE_DOWN = _by("env.iface_down", "error", "container", "a container interface setting names a Down interface",
                     *CONTAINER)
ENV_MANAGEMENT_IFACE = _by("env.management_iface", "error", "container", "a container interface setting names the "
                           "management interface", *CONTAINER)
ENV_UNSET = _by("env.unset", "error", "container", "a container interface setting is unset", *CONTAINER)
NCCL_IB_HCA_MISSING = _by("nccl.ib_hca_missing", "error", "container", "NCCL_IB_HCA names no RoCE device of the node",
                          *CONTAINER)
NCCL_IB_HCA_PARTIAL = _by("nccl.ib_hca_partial", "error", "container", "NCCL_IB_HCA leaves out a twin's RoCE device",
                          *CONTAINER)
VLLM_WRONG_NIC = _by("vllm.wrong_nic", "error", "container", "a vLLM rank's own address or control interface "
                     "(VLLM_HOST_IP, GLOO/TP_SOCKET_IFNAME) is not its node's Up fabric twin", *CONTAINER)
VLLM_RANKS_ONE_NODE = _by("vllm.ranks_one_node", "error", "container", "two vLLM ranks look like one node (the same "
                          "VLLM_HOST_IP)", "container", "serve")
VLLM_RAY_MISSING = _person("vllm.ray_missing", "error", "serve", "Ray is vLLM's executor and the image has no Ray",
                           "inventory", "choose an image with Ray or serve.vllm.executor: mp in the inventory")
VLLM_MASTER_UNREACHABLE = _person("vllm.master_unreachable", "error", "serve", "a vLLM worker cannot reach the "
                                  "master port on the head over the fabric", "site", "a link or a firewall between "
                                  "the nodes drops it: sparkctl writes no firewall rules")
SGLANG_WRONG_ADDRESS = _by("sglang.wrong_address", "error", "container", "an SGLang rank's own address or Gloo's "
                           "interface (SGLANG_HOST_IP, GLOO_SOCKET_IFNAME) is not its node's Up fabric twin",
                           *CONTAINER)
SGLANG_RANKS_ONE_NODE = _by("sglang.ranks_one_node", "error", "container", "two SGLang ranks advertise one "
                            "address (the same SGLANG_HOST_IP)", "container", "serve")
SGLANG_DIST_UNREACHABLE = _person("sglang.dist_unreachable", "error", "serve", "an SGLang worker cannot reach the "
                                  "head's --dist-init-addr over the fabric", "site", "a link or a firewall between "
                                  "the nodes drops it: sparkctl writes no firewall rules")
SGLANG_FLAG_REFUSED = _person("sglang.flag_refused", "error", "serve", "the image's SGLang release refuses a flag of "
                              "the launch", "inventory", "the flag is the inventory's (serve.args, serve.config): "
                              "fix it there")
VLLM_FLAG_REFUSED = _person("vllm.flag_refused", "error", "serve", "the image's vLLM release refuses a flag of the "
                            "launch", "inventory", "the flag is the inventory's (serve.args, serve.config): fix it "
                            "there")

# mpi
MPI_HOSTFILE_MISMATCH = _by("mpi.hostfile_mismatch", "error", "mpi", "the container's hostfile does not match the "
                            "nodes' addresses", "mpi")

# model and serve
MODEL_ABSENT = _by("model.absent", "error", "model", "a checkpoint is not in the HF cache", "model")
MODEL_INCOMPLETE = _by("model.incomplete", "error", "model", "a checkpoint is only partly downloaded", "model")
MODEL_CHANGED = _by("model.changed", "warning", "model", "files of a checkpoint changed since they were verified "
                    "against the hashes the Hub recorded (a rewrite, a truncation, a copy by hand)", "model")
HF_TOKEN_MISSING = _by("hf.token_missing", "error", "model", "no Hugging Face token on the node (export it; "
                       "model.token writes it)", "model")
SERVE_DOWN = _by("serve.down", "error", "serve", "nothing serves on the serve port", "serve")
SERVE_HEALTH = _by("serve.health", "error", "serve", "the server does not answer /health or a completion", "serve")
SERVE_UNIT_MISSING = _by("serve.unit_missing", "error", "serve", "the unit that keeps the model served is not "
                         "installed on the head", "serve")
SERVE_UNIT_FAILED = _by("serve.unit_failed", "error", "serve", "the serving unit failed and does not start the "
                        "server again", "serve")
SERVE_UNIT_LOOPING = _by("serve.unit_looping", "error", "serve", "the serving unit keeps starting the server and it "
                         "keeps ending", "serve")
SERVE_STUCK = _person("serve.stuck", "info", "serve", "the serving world was stuck (alive, generating nothing) "
                      "and the watchdog ended it for the unit to start again", "software", "the watchdog restarts "
                      "a stuck world by itself; one that keeps getting stuck has a cause in the engine or the "
                      "fabric: read the serve log around the recorded time")
SERVE_UNIT_DISABLED = _person("serve.unit_disabled", "warning", "serve", "the serving unit is disabled (`sparkctl "
                              "serve stop`): nothing is served, also after a reboot", "note", "it was stopped on "
                              "purpose: a serving bootstrap (`sparkctl cluster bootstrap FILE`) serves again")
SERVE_GATEWAY_DOWN = _by("serve.gateway_down", "error", "serve", "the gateway in front of the engine does not run or "
                         "listen where it should", "serve")
SERVE_TLS_ENDING = _person("serve.tls_ending", "warning", "serve", "the endpoint's certificate (serve.tls) ends "
                           f"within {EXPIRY_WARNING_DAYS} days, or has ended (an error: clients refuse it)",
                           "password", "a certificate is renewed by whoever issues it (your CA, ACME): then point "
                           "serve.tls at it and rerun bootstrap")
SERVE_TLS_STALE = _by("serve.tls_stale", "error", "serve", "the gateway serves another certificate than the one "
                      "serve.tls names", "serve")
SERVE_COLLECTOR_DOWN = _by("serve.collector_down", "error", "serve", "a world's figures collector on its head does "
                           "not run: its watchdog and its row of top have no figures (the first world's: the "
                           "gateway's /metrics, serve status and serve bench neither)", "serve")
SERVE_DEGENERATE = _person("serve.degenerate", "error", "serve", "the server answers with degenerate output",
                           "inventory", "a release with the Eagle3 SM12x fix, or serve.decoding: none, is the "
                           "inventory's")
NCCL_SOCKET_FALLBACK = _by("nccl.socket_fallback", "error", "verify", "NCCL ran over TCP sockets, not RDMA", *CONTAINER,
                           "serve")
NCCL_WARN = _person("nccl.warn", "error", "verify", "NCCL warned in the serve log", "software", "the warning's own "
                    "words say what NCCL met; read the serve log around it")

# doctor itself
DOCTOR_RUN_IN_PROGRESS = _person("doctor.run_in_progress", "warning", "node", "another run held the cluster lock "
                                 "while doctor looked", "note", "nothing to repair: look again once that run has ended")
DOCTOR_OUTSIDE_UNREADABLE = _person("doctor.outside_unreadable", "warning", "node", "a node outside --limit could "
                                    "not be read", "hardware", "bring the node back (power, network, sshd), then "
                                    "diagnose again")
DOCTOR_CHECK_FAILED = _person("doctor.check_failed", "warning", "node", "a doctor check crashed", "sparkctl",
                              "please report it with `sparkctl doctor --bundle`")


#: id -> its type, every one above
FINDINGS: dict[str, FindingType] = {t.id: t for t in list(globals().values()) if isinstance(t, FindingType)}


def remedies_markdown() -> str:
    """The table, id -> the tasks that repair it or why a person must (playbooks.md, `doctor --list`)."""
    out = ["| finding | what it means | closed by |", "|---|---|---|"]
    for finding_id, r in sorted(FINDINGS.items()):
        closed = ("repaired by " + ", ".join(f"`{t}`" for t in r.tasks)) if r.tasks else \
            f"needs you ({KINDS[r.kind]}): {r.person}"
        out.append(f"| `{finding_id}` | {r.about} | {closed} |")
    return "\n".join(out) + "\n"
