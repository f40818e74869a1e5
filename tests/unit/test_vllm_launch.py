"""vLLM's launch across the Sparks: every example inventory x vLLM preset x known release renders a launch that
release accepts (its own flags, from vLLM's source); each serving node's unit and world.sh; what a rank's env must
say about its node; and doctor's vLLM findings."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.probes import parse_probe, probe_script
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.engines import ENGINES
from sparkctl.facts import ContainerInfo
from sparkctl.inventory import load_inventory
from sparkctl.inventory.presets import PRESETS
from sparkctl.knowledge.vllm_releases import image_tags, known_releases, schema_for
from sparkctl.plan import plan_cluster
from sparkctl.plan.launches import is_our_server
from sparkctl.plan.vllm import VLLM_CONFIG_PATH, VllmLaunch
from sparkctl.plan.world import WorldNames
from sparkctl.rules.interface_settings import node_mismatches
from sparkctl.rules.serving import has_unit
from sparkctl.transport.framing import Framing
from tests.taskkit import inventory, spark_facts
from tests.unit.doctor_snapshot_kit import healthy_vllm_snapshot

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "inventories").glob("*.yaml"))
VLLM_PRESETS = sorted(name for name, p in PRESETS.items() if p.engine == "vllm")
TAG_OF = {release: tag for tag, release in image_tags().items()}
TWINS = ("enp1s0f1np1", "enP2p1s0f1np1")


def facts(names: list[str]) -> dict:
    return {n: spark_facts(n, mtu=9000, session_ip=f"10.0.0.{11 + i}") for i, n in enumerate(names)}


def as_vllm(example: str, preset: str, release: str, tmp_path, executor: str = "auto"):
    document = yaml.safe_load((REPO / "inventories" / example).read_text())
    document["serve"] = {"engine": "vllm", "preset": preset, "vllm": {"executor": executor}}
    if len(document["nodes"]) == 1:
        document["serve"]["tp_size"] = 1  # the presets are for two Sparks
    document["container"] = {"image": TAG_OF[release]}
    path = tmp_path / f"{example}-{preset}-{release}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_inventory(path)


@pytest.mark.parametrize("release", sorted(TAG_OF))
@pytest.mark.parametrize("preset", VLLM_PRESETS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_and_preset_renders_a_launch_the_release_accepts(example, preset, release, tmp_path):
    inv = as_vllm(example, preset, release, tmp_path)
    schema = schema_for(next(v for v in known_releases() if str(v) == release))
    plan = plan_cluster(inv, facts([n.name for n in inv.nodes]))
    launch = plan.launch
    assert launch is not None and str(launch.release) == release
    assert schema.check_config(launch.config, {}) == []
    nodes = inv.serving_nodes()
    for node, argv in launch.serve.items():
        assert argv[:3] == ["vllm", "serve", inv.serve_spec().model]
        assert schema.check_args(argv[3:], {}) == [], (node, argv)
    if len(nodes) == 1:
        assert launch.executor == "mp" and "--nnodes" not in launch.serve[nodes[0]]
    elif schema.has_nnodes:  # the release refuses Ray with --nnodes: mp, one vllm serve per node
        assert launch.executor == "mp" and list(launch.serve) == nodes and not launch.ray
        assert all("--distributed-executor-backend" not in a for a in launch.serve.values())
        assert [a[a.index("--node-rank") + 1] for a in launch.serve.values()] == [str(r) for r in range(len(nodes))]
    else:  # no --nnodes: only Ray goes across nodes
        assert launch.executor == "ray" and list(launch.ray) == nodes and list(launch.serve) == nodes[:1]
        assert "--nnodes" not in launch.serve[nodes[0]]
        assert all(a.count("--num-gpus") == 1 and a[a.index("--num-gpus") + 1] == "1" for a in launch.ray.values())


def pair(tmp_path, release: str = "0.20.1", executor: str = "auto"):
    inv = as_vllm("two-sparks.yaml", "llama-3.3-70b-vllm", release, tmp_path, executor)
    plan = plan_cluster(inv, facts(["spark1", "spark2"]))
    assert isinstance(plan.launch, VllmLaunch)
    return inv, plan


def spec_of(inv, plan, node: str):
    return plan.launch.unit(inv, node, state_dir="/home/nvidia/.local/state/sparkctl/spark-pair", user="nvidia",
                            fingerprint="f00dfeedf00dfeed")


def test_every_serving_node_has_its_own_unit_running_its_own_rank(tmp_path):
    inv, plan = pair(tmp_path)
    assert has_unit(inv, "spark1") and has_unit(inv, "spark2")
    head, worker = spec_of(inv, plan, "spark1"), spec_of(inv, plan, "spark2")
    assert head.unit_path == worker.unit_path == "/etc/systemd/system/sparkctl-serve-spark-pair.service"
    assert "ExecStart=docker exec vllm-multinode bash /sparkctl/serve/world.sh run" in worker.unit_text()
    for spec, rank in ((head, 0), (worker, 1)):
        world = spec.world_text()
        assert f"setsid {shlex.join(plan.launch.serve[spec.node])} < /dev/null &" in world
        assert f"--node-rank {rank}" in spec.run.command and ("--headless" in spec.run.command) == (rank == 1)
        assert "ray" not in world and "openmpi-hostfile" not in world and "mpirun" not in world
        # its stop reaches the process group (vLLM's engine core and workers), then what outlived it
        assert 'kill -TERM -- "-$pid"' in world and "leftovers >/dev/null" in world
        assert subprocess.run(["bash", "-n"], input=world, capture_output=True, text=True).returncode == 0
    # the worker waits for no one: its rank retries the master itself
    assert worker.run.peers == () and "ssh " not in worker.world_text()


def test_with_ray_the_head_starts_its_ray_node_under_vllm_serve_and_a_worker_is_its_ray_node(tmp_path):
    inv, plan = pair(tmp_path, release="0.10.2")
    head, worker = spec_of(inv, plan, "spark1"), spec_of(inv, plan, "spark2")
    assert head.run.before.startswith("ray start --head --port 6379") and "--block" not in head.run.before
    assert "--distributed-executor-backend ray" in head.run.command
    assert worker.run.command.startswith("ray start --address 192.168.100.10:6379")
    assert worker.run.command.endswith("--block")
    for spec in (head, worker):
        world = spec.world_text()
        assert world.count("ray stop --force") >= 2
        assert subprocess.run(["bash", "-n"], input=world, capture_output=True, text=True).returncode == 0
    assert f"if ! {head.run.before} < /dev/null; then" in head.world_text()
    assert is_our_server(worker.run.command) and not is_our_server("ray status")


def test_what_counts_as_our_server_and_what_is_left_over(tmp_path):
    assert is_our_server(f"python3 /usr/local/bin/vllm serve m --config {VLLM_CONFIG_PATH} --headless")
    assert not is_our_server("python3 /usr/local/bin/vllm serve m --config /tmp/other.yaml")
    assert is_our_server("mpirun -np 2 trtllm-llmapi-launch trtllm-serve --extra_llm_api_options "
                         "/sparkctl/serve/extra-llm-api-config.yml")
    # another world's server is ours too (`serve stop` of every world), but not the first world's own
    other = "python3 /usr/local/bin/vllm serve m --config /sparkctl/serve--gpt-oss-2/vllm.yaml"
    assert is_our_server(other)
    assert not re.search(VllmLaunch.servers(WorldNames("duo"))[0], other)
    assert re.search(VllmLaunch.servers(WorldNames("duo", "gpt-oss-2"))[0], other)
    _inv, plan = pair(tmp_path)
    script = plan.launch.leftovers(WorldNames("duo"))
    assert f"--config[ ]{VLLM_CONFIG_PATH}" in script and "'^VLLM::'" in script
    assert "SPARKCTL_WORLD=//p'); [ -z \"$w\" ] || [ \"$w\" = duo ]" in script
    assert "extra_llm_api_options" in plan_cluster(inventory("two-sparks.yaml")).launch.leftovers(WorldNames("duo"))


def test_a_rank_s_env_must_name_its_own_node_s_fabric(tmp_path):
    inv, plan = pair(tmp_path)
    f = spark_facts("spark2", addresses={t: [f"192.168.10{i}.11/24"] for i, t in enumerate(TWINS)}, mtu=9000,
                    session_ip="10.0.0.12")
    env = dict(plan.nodes["spark2"].container.env)
    assert node_mismatches("spark2", env, f, ENGINES["vllm"]) == []
    bad = {**env, "VLLM_HOST_IP": "10.0.0.12", "GLOO_SOCKET_IFNAME": "enP7s7"}
    found = {m.setting: m.has for m in node_mismatches("spark2", bad, f, ENGINES["vllm"])}
    assert "not an Up fabric twin" in found["VLLM_HOST_IP"] and "management" in found["GLOO_SOCKET_IFNAME"]
    stranger = {m.setting: m.has for m in node_mismatches("spark2", {**env, "VLLM_HOST_IP": "192.168.100.10"}, f,
                                                          ENGINES["vllm"])}
    assert "does not own 192.168.100.10" in stranger["VLLM_HOST_IP"]
    unset = {**env}
    del unset["TP_SOCKET_IFNAME"]
    assert [m.setting for m in node_mismatches("spark2", unset, f, ENGINES["vllm"])] == ["TP_SOCKET_IFNAME"]
    # Open MPI's out-of-band channel is TensorRT-LLM's (mpirun), not asked of a vLLM container
    assert "OMPI_MCA_oob_tcp_if_include" not in env


# --- doctor ---------------------------------------------------------------------------------------------------

def ids(s: Snapshot) -> set[tuple[str, str]]:
    return {(f.id, f.node) for f in run_checks(s).findings if f.severity == "error"}


def test_two_healthy_sparks_serving_with_vllm_have_no_findings():
    found = [(f.id, f.node, f.evidence) for f in run_checks(healthy_vllm_snapshot()).findings]
    assert found == []


def test_doctor_finds_vllm_s_own_failures_each_with_its_evidence():
    s = healthy_vllm_snapshot()
    # a worker whose rank cannot reach the master while the head serves
    s.probes["spark2"].rendezvous = ("192.168.100.10:29501", False)
    s.probes["spark2"].serve_log_tail = ("[W socket.cpp] The client socket has failed to connect to "
                                         "[192.168.100.10]:29501 (errno: 113 - No route to host).")
    found = next(f for f in run_checks(s).findings if f.id == "vllm.master_unreachable")
    assert found.node == "spark2" and "192.168.100.10:29501" in found.evidence and "socket.cpp" in found.evidence
    s.probes["spark2"].rendezvous = ("192.168.100.10:29501", True)
    # the release refused a flag
    s.probes["spark2"].serve_log_tail = "usage: vllm serve [options] [model_tag]\nvllm serve: error: unrecognized " \
                                        "arguments: --swap-space 4"
    assert ("vllm.flag_refused", "spark2") in ids(s)
    s.probes["spark2"].serve_log_tail = ""
    # both containers say one address
    env = s.facts["spark2"].containers["vllm-multinode"].env
    s.facts["spark2"].containers["vllm-multinode"] = dataclasses.replace(
        s.facts["spark2"].containers["vllm-multinode"], env={**env, "VLLM_HOST_IP": "192.168.100.10"})
    assert {("vllm.ranks_one_node", "spark2"), ("vllm.wrong_nic", "spark2")} <= ids(s)


def test_doctor_finds_ray_missing_and_probes_only_what_vllm_has(tmp_path):
    inv, plan = pair(tmp_path, release="0.10.2")
    f = spark_facts("spark2", mtu=9000, session_ip="10.0.0.12")
    f.containers = {"vllm-multinode": ContainerInfo("vllm-multinode", exists=True, running=True, status="running")}
    script = probe_script(inv, plan, f, "spark2", ["spark1", "spark2"], nonce="n0nce")
    assert "command -v ray" in script and "openmpi-hostfile" not in script and "authorized_keys" not in script
    assert "sparkctl-serve-spark-pair.service" in script  # the worker's own unit
    inv_mp, plan_mp = pair(tmp_path)
    worker = probe_script(inv_mp, plan_mp, f, "spark2", ["spark1", "spark2"], nonce="n0nce")
    assert "/dev/tcp/192.168.100.10/29501" in worker and "command -v ray" not in worker
    # the section's own output, as the node prints it: where, then open or closed
    section = Framing("n0nce").section("rendezvous", "printf '192.168.100.10:29501\\nclosed\\n'")
    output = subprocess.run(["sh", "-c", section], capture_output=True, text=True).stdout
    assert parse_probe(output, "n0nce").rendezvous == ("192.168.100.10:29501", False)


def test_cluster_plan_shows_every_node_s_unit_and_world_and_the_gateway():
    from click.testing import CliRunner

    from sparkctl.cli.main import cli

    result = CliRunner().invoke(cli, ["cluster", "plan", str(REPO / "inventories" / "two-sparks-vllm.yaml")])
    assert result.exit_code == 0, result.output
    for node in ("spark1", "spark2"):
        assert f"--- /etc/systemd/system/sparkctl-serve-spark-pair.service on {node} " in result.output
        assert f"/run/serve/world.sh on {node} (mounted at /sparkctl/serve/world.sh" in result.output
    assert result.output.count("setsid vllm serve meta-llama/Llama-3.3-70B-Instruct") == 2
    cluster_part = result.output.split("\nvLLM: ", 1)[1]
    assert "--- gateway on spark1 (NGINX" in cluster_part and "mpirun" not in cluster_part
