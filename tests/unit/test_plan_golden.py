"""The two-Spark inventory against golden files, and against NVIDIA's official procedure (NVIDIA/dgx-spark-playbooks,
nvidia/speculative-decoding/README.md and nvidia/trt-llm/README.md).

Every difference from the official procedure must be one of DELIBERATE_IMPROVEMENTS, with its reason; any other
difference fails, and so does an improvement that no longer appears (the list stays true).
Regenerate the golden files with `SPARKCTL_UPDATE_GOLDEN=1 pytest tests/unit/test_plan_golden.py`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex

import pytest
import yaml
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.plan import plan_cluster
from sparkctl.plan.trtllm import launch_argv
from tests.taskkit import REPO, inventory

GOLDEN = REPO / "tests" / "fixtures" / "golden" / "two-sparks"
UPDATE = os.environ.get("SPARKCTL_UPDATE_GOLDEN") == "1"
INVENTORY = REPO / "inventories" / "two-sparks.yaml"
HOME = "/home/nvidia"  # the inventory's user; offline, the plan assumes /home/<user>

# --- the official procedure, as data ------------------------------------------------------------------------
# The speculative-decoding two-Spark playbook: interfaces of port 1, image 1.3.0rc12 (nvidia/speculative-decoding).
OFFICIAL_IFACES = "enp1s0f1np1,enP2p1s0f1np1"
OFFICIAL_DOCKER_RUN = f"""
docker run -d --rm --name trtllm-multinode --gpus '"device=all"' --network host
  --ulimit memlock=-1 --ulimit stack=67108864 --device /dev/infiniband:/dev/infiniband
  -e UCX_NET_DEVICES={OFFICIAL_IFACES} -e NCCL_SOCKET_IFNAME={OFFICIAL_IFACES}
  -e OMPI_MCA_btl_tcp_if_include={OFFICIAL_IFACES}
  -e OMPI_MCA_orte_default_hostfile=/etc/openmpi-hostfile -e OMPI_MCA_rmaps_ppr_n_pernode=1
  -e OMPI_ALLOW_RUN_AS_ROOT=1 -e OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  -e CPATH=/usr/local/cuda/include -e TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas
  -v ~/.cache/huggingface/:/root/.cache/huggingface/ -v ~/.ssh:/tmp/.ssh:ro
  nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12 bash -c "curl <entrypoint url> | bash"
"""
# The speculative-decoding playbook's addressing: both twins of a node in one /24 (A .12 + .14, B .13 + .15).
OFFICIAL_ADDRESSES = {
    "spark1": {"enp1s0f1np1": "192.168.200.12/24", "enP2p1s0f1np1": "192.168.200.14/24"},
    "spark2": {"enp1s0f1np1": "192.168.200.13/24", "enP2p1s0f1np1": "192.168.200.15/24"},
}
OFFICIAL_CONFIG = yaml.safe_load("""
enable_attention_dp: false
disable_overlap_scheduler: false
enable_autotuner: false
enable_chunked_prefill: false
cuda_graph_config: {max_batch_size: 1}
speculative_config: {decoding_type: Eagle, max_draft_len: 3, speculative_model_dir: /opt/Qwen3-235B-A22B-Eagle3/}
kv_cache_config: {free_gpu_memory_fraction: 0.9, enable_block_reuse: false}
""")
OFFICIAL_MODEL = "nvidia/Qwen3-235B-A22B-FP4"
# What runs inside `docker exec -e MODEL=... -e HF_TOKEN trtllm-multinode bash -c '...'` on the head.
OFFICIAL_LAUNCH = """
mpirun -x CPATH=/usr/local/cuda/include -x TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas -x HF_TOKEN
  trtllm-llmapi-launch trtllm-serve $MODEL --backend pytorch --tp_size 2 --max_num_tokens 1024
  --extra_llm_api_options /tmp/extra-llm-api-config.yml --port 8355 --host 0.0.0.0
"""
# NVIDIA's entrypoint (fetched with curl): sshd and the client config it writes (nvidia/trt-llm/README.md).
OFFICIAL_SSHD = {"Port": "2233", "PermitRootLogin": "yes", "PubkeyAuthentication": "yes"}
OFFICIAL_SSH_CLIENT = {"Port": "2233", "StrictHostKeyChecking": "no", "UserKnownHostsFile": "/dev/null"}

TOKEN_AS_FILE = ("HF_HOME set and the token as a 0600 file ($HF_HOME/token, read by huggingface_hub) instead of "
                 "HF_TOKEN in the env or on the mpirun line (where ps and logs show it)")
SEPARATE_SUBNETS = ("twins in separate /24s (192.168.100/101, NVIDIA's current addressing) instead of one /24: two "
                    "interfaces in one subnet cause ARP/route confusion and NCCL failures")
ENTRYPOINT_SHIPPED = ("the entrypoint ships with sparkctl and is mounted read-only instead of `curl <url> | bash` "
                      "(unpinned code from the internet at every start)")
DELIBERATE_IMPROVEMENTS = {
    # container (each node)
    "run: flag --rm removed": "no --rm: the logs of an exited container stay readable (`docker logs`)",
    "run: option --restart added": "--restart unless-stopped: the node's docker brings the container back when the "
                                   "node boots or the container dies (--rm could not carry a policy)",
    "run: env NCCL_IB_HCA added": "both twins' RoCE devices of the node's own port; without it NCCL can silently "
                                  "fall back to TCP (a fraction of the bandwidth)",
    "run: env OMPI_MCA_oob_tcp_if_include added": "else ORTE may use the management network",
    "run: env HF_HOME added": TOKEN_AS_FILE,
    "run: env HF_HUB_OFFLINE added": "the engines load the commit model.pin chose from the cache and never ask the "
                                     "Hub at start (a moved main would be downloaded mid-launch: sparkrun issue "
                                     "239); sparkctl's own downloads go online",
    "run: mount /tmp/.ssh from <state>/container-ssh instead of ~/.ssh":
        "the user's ~/.ssh is not mounted: the container keys are made by sparkctl for the cluster",
    "run: mount /opt/sparkctl/entrypoint.sh added": ENTRYPOINT_SHIPPED,
    "run: mount /sparkctl added": "sparkctl's per-node state (serve config, logs) lives on the host and survives "
                                  "re-creating the container",
    "run: label sparkctl.cluster added": "tells sparkctl's containers from others",
    "run: env SPARKCTL_SSHD_LISTEN added": "the container sshd listens on the node's fabric addresses only (NVIDIA's "
                                           "answers on every interface, the management LAN and Wi-Fi included, and "
                                           "lets root in)",
    "run: label sparkctl.spec added": "hash of the wanted spec: a container started from another spec is drift",
    "run: command changed": ENTRYPOINT_SHIPPED,
    # addressing and hostfile
    **{f"address {node} {iface}: {old} -> {new}": SEPARATE_SUBNETS
       for node, iface, old, new in [
           ("spark1", "enp1s0f1np1", "192.168.200.12/24", "192.168.100.10/24"),
           ("spark1", "enP2p1s0f1np1", "192.168.200.14/24", "192.168.101.10/24"),
           ("spark2", "enp1s0f1np1", "192.168.200.13/24", "192.168.100.11/24"),
           ("spark2", "enP2p1s0f1np1", "192.168.200.15/24", "192.168.101.11/24")]},
    # TensorRT-LLM config
    "config: speculative_config.speculative_model_dir changed": "the draft is kept in the mounted HF cache "
                                                                "instead of /opt (lost with the container)",
    "config: enable_iter_perf_stats added": "trtllm-serve's /metrics records iterations only with it: top, serve "
                                            "status and serve bench read them (a user's own false is kept)",
    # launch line
    "launch: --host changed": "127.0.0.1, not 0.0.0.0: the engine answers only the gateway on the head, which "
                              "checks the API key and listens where serve.listen says (docs/gateway.md)",
    "launch: --port changed": "the engine's own port (serve.engine_port, 18355): the serve port, 8355, is the "
                              "gateway's, on the head's addresses and its loopback",
    "launch: -x HF_TOKEN removed": TOKEN_AS_FILE,
    "launch: -x HF_HOME added": TOKEN_AS_FILE,
    "launch: -x --mca plm_rsh_pass_environ_mca_params added": "Open MPI would copy the head's OMPI_MCA_* interface "
                                                               "names onto every peer (wrong where Up ports differ)",
    "launch: --max_batch_size added": "serve.max_batch_size reaches the server (the playbook sets only "
                                      "cuda_graph_config.max_batch_size, which bounds graph capture; the server then "
                                      "runs with the release default, 2048); NVIDIA's single-Spark examples pass "
                                      "--max_batch_size 1",
    "launch: --extra_llm_api_options changed": "the config is written on the host into the mounted state dir "
                                               "(/sparkctl/serve) instead of /tmp inside the container",
    # entrypoint
    "entrypoint: sshd PermitRootLogin changed": "prohibit-password: root only with the cluster key",
    "entrypoint: client StrictHostKeyChecking changed": "host keys pinned (sparkctl writes known_hosts) instead of "
                                                        "accepting any key",
    "entrypoint: client UserKnownHostsFile changed": "host keys pinned (sparkctl writes known_hosts) instead of "
                                                     "accepting any key",
}


# --- golden files ---------------------------------------------------------------------------------------------

def rendered() -> dict[str, str]:
    """Every golden artifact of the two-Spark inventory, by file name."""
    plan = plan_cluster(inventory("two-sparks.yaml"))
    result = CliRunner().invoke(cli, ["cluster", "plan", str(INVENTORY)])
    assert result.exit_code == 0, result.output
    out = {"plan.txt": result.stdout, "hostfile": plan.hostfile, "extra-llm-api-config.yml": plan.launch.config_text(),
           "launch.txt": plan.launch.head_command() + "\n", "entrypoint.sh": plan.entrypoint}
    for name, node in plan.nodes.items():
        out[f"container.{name}.json"] = json.dumps(node.container.run_argv(), indent=1) + "\n"
        out[f"netplan.{name}.yaml"] = node.netplan
    return out


@pytest.mark.parametrize("name", sorted(rendered()))
def test_golden(name):
    got = rendered()[name]
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"{path} is missing: run with SPARKCTL_UPDATE_GOLDEN=1"
    assert got == path.read_text(), f"{name} differs from {path} (SPARKCTL_UPDATE_GOLDEN=1 to accept)"


def test_no_stale_golden_files():
    assert sorted(p.name for p in GOLDEN.iterdir()) == sorted(rendered())


# --- against the official procedure ---------------------------------------------------------------------------

def docker_run_parts(argv: list[str]) -> dict:
    assert argv[:2] == ["docker", "run"]
    parts: dict = {"flags": set(), "options": {}, "env": {}, "mounts": {}, "labels": {}, "ulimits": set()}
    i = 2
    while argv[i].startswith("-"):
        opt = argv[i]
        if opt in ("-d", "--rm"):
            parts["flags"].add(opt)
            i += 1
            continue
        value = argv[i + 1]
        i += 2
        if opt == "-e":
            key, _, val = value.partition("=")
            parts["env"][key] = val
        elif opt == "-v":
            host, inside, *mode = value.replace("~", HOME, 1).split(":")
            parts["mounts"][inside] = (host, mode)
        elif opt == "--label":
            key, _, val = value.partition("=")
            parts["labels"][key] = val
        elif opt == "--ulimit":
            parts["ulimits"].add(value)
        else:
            parts["options"][opt] = value
    parts["image"], parts["command"] = argv[i], argv[i + 1:]
    return parts


def dict_differences(prefix: str, official: dict, ours: dict) -> list[str]:
    out = []
    for key in sorted(set(official) | set(ours)):
        if key not in ours:
            out.append(f"{prefix}{key} removed")
        elif key not in official:
            out.append(f"{prefix}{key} added")
        elif official[key] != ours[key]:
            out.append(f"{prefix}{key} changed")
    return out


def run_differences(official: list[str], ours: list[str]) -> list[str]:
    a, b = docker_run_parts(official), docker_run_parts(ours)
    out = [f"run: flag {f} removed" for f in sorted(a["flags"] - b["flags"])]
    out += [f"run: flag {f} added" for f in sorted(b["flags"] - a["flags"])]
    out += [f"run: ulimit {u} differs" for u in sorted(a["ulimits"] ^ b["ulimits"])]
    out += dict_differences("run: option ", a["options"], b["options"])
    out += dict_differences("run: env ", a["env"], b["env"])
    out += dict_differences("run: label ", a["labels"], b["labels"])
    for inside in sorted(set(a["mounts"]) | set(b["mounts"])):
        if inside not in b["mounts"]:
            out.append(f"run: mount {inside} removed")
        elif inside not in a["mounts"]:
            out.append(f"run: mount {inside} added")
        elif a["mounts"][inside] != b["mounts"][inside]:
            (ha, ma), (hb, mb) = a["mounts"][inside], b["mounts"][inside]
            state = hb.replace("/home/nvidia/.local/state/sparkctl/spark-pair", "<state>")
            what = f"from {state} instead of {ha.replace(HOME, '~')}" if ha != hb else f"mode {ma} -> {mb}"
            out.append(f"run: mount {inside} {what}")
    if a["image"] != b["image"]:
        out.append("run: image changed")
    if a["command"] != b["command"]:
        out.append("run: command changed")
    return out


def flatten(doc: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def launch_parts(argv: list[str]) -> tuple[dict, list[str], dict]:
    assert argv[0] == "mpirun"
    exported, i = {}, 1
    while argv[i] in ("-x", "--mca"):
        if argv[i] == "-x":
            key, _, value = argv[i + 1].partition("=")
            exported[key] = value
            i += 2
        else:
            exported[f"--mca {argv[i + 1]}"] = argv[i + 2]
            i += 3
    program = []
    while not argv[i].startswith("--"):
        program.append(argv[i])
        i += 1
    options = dict(zip(argv[i::2], argv[i + 1::2], strict=True))
    return exported, program, options


def launch_differences(official: list[str], ours: list[str]) -> list[str]:
    (xa, pa, oa), (xb, pb, ob) = launch_parts(official), launch_parts(ours)
    out = dict_differences("launch: -x ", xa, xb)
    if pa != pb:
        out.append("launch: program changed")
    return out + dict_differences("launch: ", oa, ob)


def sshd_settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#"):
            out.setdefault(key, value.strip())
    return out


def entrypoint_differences(entrypoint: str) -> list[str]:
    client = entrypoint.split("cat > /root/.ssh/config <<CONFIG\n", 1)[1].split("\nCONFIG", 1)[0]
    server = entrypoint.split("cat > /etc/ssh/sshd_config.sparkctl <<CONFIG\n", 1)[1].split("\nCONFIG", 1)[0]
    ours_client, ours_server = sshd_settings(client), sshd_settings(server)
    out = [f"entrypoint: sshd {k} changed" for k, v in OFFICIAL_SSHD.items() if ours_server.get(k) != v]
    return out + [f"entrypoint: client {k} changed" for k, v in OFFICIAL_SSH_CLIENT.items() if ours_client.get(k) != v]


def hostfile_problems(hostfile: str, addresses: dict[str, dict[str, str]], nodes: list[str],
                      first_iface: dict[str, str]) -> list[str]:
    """The official shape: head first, one line per node, the node's address on its first fabric interface."""
    want = [str(ipaddress.ip_interface(addresses[n][first_iface[n]]).ip) for n in nodes]
    return [] if hostfile.splitlines() == want else [f"hostfile: {hostfile.splitlines()} instead of {want}"]


def all_differences() -> list[str]:
    inv = inventory("two-sparks.yaml")
    plan = plan_cluster(inv)
    nodes = [n.name for n in inv.nodes]
    official_run = shlex.split(OFFICIAL_DOCKER_RUN)
    out: list[str] = []
    for name in nodes:
        out += run_differences(official_run, plan.nodes[name].container.run_argv())
    ours = {n: {i: str(a) for i, a in plan.fabric.addresses[n].items()} for n in nodes}
    for node in nodes:
        for iface in sorted(set(OFFICIAL_ADDRESSES[node]) | set(ours[node])):
            old, new = OFFICIAL_ADDRESSES[node].get(iface), ours[node].get(iface)
            if old != new:
                out.append(f"address {node} {iface}: {old} -> {new}")
    first = {n: plan.fabric.ports[n].interfaces[0] for n in nodes}
    assert first == {n: OFFICIAL_IFACES.split(",")[0] for n in nodes}
    out += hostfile_problems(plan.hostfile, ours, nodes, first)
    out += dict_differences("config: ", flatten(OFFICIAL_CONFIG), flatten(yaml.safe_load(plan.launch.config_text())))
    official_launch = shlex.split(OFFICIAL_LAUNCH.replace("$MODEL", OFFICIAL_MODEL))
    out += launch_differences(official_launch, launch_argv(inv))
    out += entrypoint_differences(plan.entrypoint)
    return sorted(set(out))


def test_differences_from_the_official_procedure_are_exactly_the_deliberate_ones():
    found = set(all_differences())
    unexpected = sorted(found - set(DELIBERATE_IMPROVEMENTS))
    gone = sorted(set(DELIBERATE_IMPROVEMENTS) - found)
    assert unexpected == [], f"differences from NVIDIA's procedure that are not deliberate: {unexpected}"
    assert gone == [], f"listed as deliberate but no longer there (remove them from the list): {gone}"
    assert all(reason.strip() for reason in DELIBERATE_IMPROVEMENTS.values())


def test_same_env_values_as_the_playbook():
    """The values the improvements keep: exactly the playbook's, on both nodes."""
    official = docker_run_parts(shlex.split(OFFICIAL_DOCKER_RUN))["env"]
    plan = plan_cluster(inventory("two-sparks.yaml"))
    for node in plan.nodes.values():
        env = node.container.env
        assert {k: env[k] for k in official} == official
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"  # both twins
        assert env["OMPI_MCA_oob_tcp_if_include"] == OFFICIAL_IFACES
        assert not any("TOKEN" in k for k in env)


def test_the_comparison_catches_an_undeclared_difference():
    """The checker itself must be able to fail: a dropped --ulimit or a changed value is reported."""
    official = shlex.split(OFFICIAL_DOCKER_RUN)
    plan = plan_cluster(inventory("two-sparks.yaml"))
    argv = plan.nodes["spark1"].container.run_argv()
    i = argv.index("stack=67108864")
    broken = argv[:i - 1] + argv[i + 1:]
    broken[broken.index("-e") + 1] = "CPATH=/wrong"
    found = set(run_differences(official, broken)) - set(DELIBERATE_IMPROVEMENTS)
    assert found == {"run: ulimit stack=67108864 differs", "run: env CPATH changed"}



def test_the_plan_shows_every_artifact_a_run_writes_or_starts():
    """The containers' entrypoint with the sshd config it writes (its port), and the gateway with its config."""
    result = CliRunner().invoke(cli, ["cluster", "plan", str(INVENTORY)], catch_exceptions=False)
    text = result.output
    assert result.exit_code == 0
    assert "--- /opt/sparkctl/entrypoint.sh" in text and "\nPort 2233\n" in text and "ListenAddress $address" in text
    assert "--- gateway on spark1 (NGINX" in text and "gateway/nginx.conf (mode 600)" in text
    assert 'if ($http_authorization != "Bearer ********")' in text and "--restart unless-stopped" in text
