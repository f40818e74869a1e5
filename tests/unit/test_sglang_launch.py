"""SGLang's launch across the Sparks: every example inventory x SGLang preset x known release renders a launch that
release accepts (its own flags and start-up checks, from SGLang's source); each rank's container env names its own
node's fabric; each serving node's unit; the inventory's SGLang settings refused at file:line; doctor's SGLang
findings."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkctl.doctor.diagnose import run_checks
from sparkctl.errors import InventoryError
from sparkctl.inventory import load_inventory
from sparkctl.inventory.presets import PRESETS
from sparkctl.knowledge.sglang_releases import known_releases, release_of, schema_for
from sparkctl.plan import plan_cluster
from sparkctl.plan.launches import is_our_server
from sparkctl.plan.sglang import SglangLaunch
from sparkctl.plan.world import WorldNames
from sparkctl.rules.interface_settings import node_mismatches
from sparkctl.rules.serving import has_unit, without_mpi
from tests.taskkit import spark_facts
from tests.unit.doctor_snapshot_kit import healthy_sglang_snapshot

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (REPO / "inventories").glob("*.yaml"))
SGLANG_PRESETS = sorted(name for name, p in PRESETS.items() if p.engine == "sglang")
RELEASES = [str(v) for v in known_releases()]


def facts(names: list[str]) -> dict:
    return {n: spark_facts(n, mtu=9000, session_ip=f"10.0.0.{11 + i}") for i, n in enumerate(names)}


def addressed() -> dict:
    """The pair with port 1 cabled, addressed as planned (.10 the head, .11 the peer)."""
    return {n: spark_facts(n, session_ip=f"10.0.0.{11 + i}", addresses={
        "enp1s0f1np1": [f"192.168.100.{10 + i}/24"], "enP2p1s0f1np1": [f"192.168.101.{10 + i}/24"]})
        for i, n in enumerate(("spark1", "spark2"))}


def as_sglang(example: str, preset: str, release: str, tmp_path, **serve):
    document = yaml.safe_load((REPO / "inventories" / example).read_text())
    document["serve"] = {"engine": "sglang", "preset": preset, **serve}
    if len(document["nodes"]) == 1:
        document["serve"]["tp_size"] = 1  # the presets are for two Sparks
    document["container"] = {"image": f"lmsysorg/sglang:v{release}-cu130"}
    path = tmp_path / f"{example}-{preset}-{release}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_inventory(path)


def flags_of(argv: list[str]) -> dict[str, str | bool]:
    """--flag value pairs, and on/off flags as True (no value follows them)."""
    out: dict[str, str | bool] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            follows = argv[i + 1] if i + 1 < len(argv) else "--"
            out[token] = True if follows.startswith("--") else follows
    return out


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("preset", SGLANG_PRESETS)
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_and_preset_renders_a_launch_the_release_accepts(example, preset, release, tmp_path):
    inv = as_sglang(example, preset, release, tmp_path)
    schema = schema_for(release_of(inv.container.image))
    assert str(schema.version) == release
    launch = plan_cluster(inv, facts([n.name for n in inv.nodes])).launch
    assert isinstance(launch, SglangLaunch) and str(launch.release) == release
    nodes = inv.serving_nodes()
    assert list(launch.commands()) == nodes
    for rank, node in enumerate(nodes):
        argv = launch.commands()[node]
        assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
        assert schema.check_flags(argv[3:]) == [], (node, argv)
        values = flags_of(argv[3:])
        assert values["--model-path"] == inv.serve_spec().model
        assert values["--port"] == str(inv.serve_spec().engine_port) and values["--enable-metrics"] is True
        if len(nodes) > 1:
            assert values["--node-rank"] == str(rank) and values["--nnodes"] == str(len(nodes))
            assert values["--dist-init-addr"] == launch.rendezvous()
        else:
            assert "--nnodes" not in argv and launch.rendezvous() is None
        flags = {a: v for a, v in values.items() if a.startswith("--speculative")}
        assert schema.speculative_problems(flags) == [], flags
        world = {"--tensor-parallel-size": values["--tp-size"], "--nnodes": values.get("--nnodes", "1")}
        assert schema.multi_node_problems(world) == []


def test_each_rank_advertises_its_own_node_s_fabric_and_needs_no_mpi(tmp_path):
    inv = load_inventory(REPO / "inventories" / "two-sparks-sglang.yaml")
    plan = plan_cluster(inv, addressed())
    assert without_mpi(inv) and "SGLang" in without_mpi(inv) and plan.hostfile == "" and plan.entrypoint == ""
    for node in ("spark1", "spark2"):
        spec = plan.nodes[node].container
        own = spec.env["GLOO_SOCKET_IFNAME"]
        assert spec.env["SGLANG_HOST_IP"] == str(plan.fabric.addresses[node][own].ip)
        assert "OMPI_MCA_oob_tcp_if_include" not in spec.env and "SPARKCTL_SSHD_LISTEN" not in spec.env
        argv = spec.run_argv()
        assert argv[-3:] == ["nvcr.io/nvidia/sglang:26.02-py3", "sleep", "infinity"]  # no sshd, no mesh
        assert "--init" in argv and argv[argv.index("--cap-add") + 1] == "IPC_LOCK"
        assert node_mismatches(node, spec.env, addressed()[node], inv.engine()) == []
        assert has_unit(inv, node)
    wrong = {**plan.nodes["spark2"].container.env, "SGLANG_HOST_IP": "10.0.0.12"}
    found = {m.setting: m.has for m in node_mismatches("spark2", wrong, addressed()["spark2"], inv.engine())}
    assert "not an Up fabric twin" in found["SGLANG_HOST_IP"]


def test_every_serving_node_runs_its_own_rank_under_its_unit(tmp_path):
    inv = load_inventory(REPO / "inventories" / "two-sparks-sglang.yaml")
    launch = plan_cluster(inv, facts(["spark1", "spark2"])).launch
    for rank, node in enumerate(("spark1", "spark2")):
        unit = launch.unit(inv, node, state_dir="/home/nvidia/.local/state/sparkctl/spark-pair", user="nvidia",
                           fingerprint="f00dfeedf00dfeed")
        world = unit.world_text()
        assert f"setsid {shlex.join(launch.commands()[node])} < /dev/null &" in world
        assert f"rank {rank} of 2" in unit.unit_text() and "mpirun" not in world and "ray" not in world
        assert "docker exec sglang-multinode bash /sparkctl/serve/world.sh run" in unit.unit_text()
        assert subprocess.run(["bash", "-n"], input=world, capture_output=True, text=True).returncode == 0
        assert is_our_server(unit.run.command) and "'^sglang::'" in launch.leftovers(WorldNames("duo"))
    assert launch.config_file is None and launch.config_text() == ""


@pytest.mark.parametrize("serve, where, says", [
    ({"args": ["--tp_size", "2"]}, "serve.args[0]", "unrecognized arguments: --tp_size 2"),
    ({"config": {"mem-fraction-static": "lots"}}, "serve.config.mem-fraction-static", "invalid float value"),
    ({"config": {"speculative-eagle-topk": 2, "page-size": 16, "attention-backend": "triton"}},
     "serve.config.speculative-eagle-topk", "ValueError: speculative_eagle_topk > 1 with page_size > 1"),
    ({"args": ["--port", "9000"]}, "serve.args[0]", "sparkctl's to set"),
    ({"config": {"mem-fraction-static": {"a": 1}}}, "serve.config.mem-fraction-static", "not a mapping"),
])
def test_what_the_release_refuses_is_refused_at_its_line(tmp_path, serve, where, says):
    document = yaml.safe_load((REPO / "inventories" / "two-sparks-sglang.yaml").read_text())
    document["serve"].update(serve)
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(InventoryError) as refused:
        load_inventory(path)
    line = next(x for x in str(refused.value).splitlines() if where in x)
    assert says in line and f"{path}:" in line, str(refused.value)


def test_doctor_names_a_rank_advertising_another_node_s_address_and_a_worker_that_cannot_meet():
    s = healthy_sglang_snapshot()
    assert [f.id for f in run_checks(s).findings if f.severity == "error"] == []
    head_ip = s.plan.nodes["spark1"].container.env["SGLANG_HOST_IP"]
    for node in ("spark1", "spark2"):
        s.facts[node].containers["sglang-multinode"].env = dict(s.plan.nodes[node].container.env)
    s.facts["spark2"].containers["sglang-multinode"].env["SGLANG_HOST_IP"] = head_ip
    s.probes["spark2"].rendezvous = (s.probes["spark2"].rendezvous[0], False)
    ids = {(f.id, f.node) for f in run_checks(s).findings}
    assert {("sglang.ranks_one_node", "spark2"), ("sglang.wrong_address", "spark2"),
            ("sglang.dist_unreachable", "spark2")} <= ids, ids
