"""serve.collector (tasks/serve/collector.py, plan/collector.py): each TensorRT-LLM world's figures collector on its
head, beside its engine, its container named by its world; what container.retire and serve.gateway_remove do with a
collector no world plans. The collector's own counting is tests/unit/test_serve_collector.py's; the real containers
are proven in the lab (tests/lab/test_bootstrap_serve.py, tests/lab/test_serve_several_trtllm.py)."""

from __future__ import annotations

import hashlib

import pytest

from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.plan.collector import collector_script, collector_spec, is_collector
from sparkctl.plan.gateway import gateway_spec
from sparkctl.plan.trtllm import TrtllmLaunch
from sparkctl.taskgraph.task import Change, TaskFailed
from sparkctl.tasks.container.retire import ContainerRetireTask
from sparkctl.tasks.serve.collector import ServeCollectorTask
from sparkctl.tasks.serve.gateway import GatewayRemoveTask
from tests.taskkit import framed, inspected, inventory_from_yaml, make_kit, spark_facts

PAIR = """
user: nvidia
cluster: {name: duo}
nodes: [{name: spark1, host: 10.0.0.11}, {name: spark2, host: 10.0.0.12}]
serve: {preset: qwen3-235b-eagle3}
"""
#: a TP=2 world on spark1+spark2 and a one-node world on spark3 (the lab of three's shape)
THREE = """
user: nvidia
cluster: {name: trio}
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
  - {name: spark3, host: 10.0.0.13}
fabric: {topology: ring}
serve:
  models:
    - {preset: qwen3-235b-eagle3, nodes: [spark1, spark2]}
    - {preset: gpt-oss-120b-eagle3, name: oss, nodes: [spark3]}
"""
KEY = "k3y-0f-the-endpoint_AbCdEfGhIjKlMnOpQrStUvWxYz012"
SCRIPT_SHA = hashlib.sha256(collector_script().encode()).hexdigest()


@pytest.fixture(autouse=True)
def own_state(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def kit_of(inv):
    return make_kit(inv, {n.name: spark_facts(n.name) for n in inv.nodes})


def planned(inv, kit) -> list:
    """Each world's collector as serve.collector plans it: (node, spec)."""
    plan = plan_cluster(inv, kit.cluster.facts_by_node())
    out = []
    for world in inv.worlds():
        view = inv.for_world(world)
        head = view.serving_nodes()[0]
        out.append((head, collector_spec(view, kit.node(head).state_dir(), plan.hosts[world.key])))
    return out


def answering(kit, node: str, script: str, containers: dict[str, str]) -> None:
    """`node` answers serve.collector's read with the script's sha256 (`sha256sum`'s line; nothing: no script), and
    its facts show each container as its inspect line says (tests/taskkit.py inspected)."""
    summed = f"{script}  /home/nvidia/.local/state/sparkctl/spark-pair/run/collector.py\n" if script else ""
    kit.transport(node).respond(r"sha256sum", framed(lambda: [("collector-script", summed)]))
    for name, line in containers.items():
        inspected(kit, node, name, line)


def running(spec) -> str:
    return f"true {spec.spec_hash()} unless-stopped"


def test_the_first_world_s_collector_answers_on_the_head_s_loopback_and_keeps_its_name(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    spec = collector_spec(inv, "/st")
    assert spec is not None and spec.port == 18356 and spec.engine_port == 18355
    assert spec.container == "sparkctl-collector" and spec.host == "127.0.0.1"
    argv = spec.run_argv()
    assert argv[argv.index("--name") + 1] == "sparkctl-collector"
    assert argv[argv.index("--restart") + 1] == "unless-stopped" and argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--entrypoint") + 1] == "python3" and inv.container.image in argv
    assert argv[-7:] == ["/opt/sparkctl-collector/serve-collector.py", "--engine", "http://127.0.0.1:18355/metrics",
                         "--listen", "127.0.0.1:18356", "--interval", "1"]
    assert "/st/collector:/opt/sparkctl-collector:ro" in argv
    # vLLM keeps cumulative counters: no collector, /metrics is the engine's
    vllm = inventory_from_yaml(PAIR.replace("qwen3-235b-eagle3", "llama-3.3-70b-vllm"), tmp_path)
    assert collector_spec(vllm, "/st") is None
    assert gateway_spec(vllm, spark_facts("spark1"), "/st").metrics_port is None


def test_a_collector_converges_script_container_and_state(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    kit = kit_of(inv)
    ((node, spec),) = planned(inv, kit)
    assert node == "spark1"
    task = ServeCollectorTask()
    answering(kit, "spark1", "", {"sparkctl-collector": ""})
    changes = task.check(kit.cluster)
    assert [c.payload for c in changes] == [("sparkctl-collector", "script"), ("sparkctl-collector", "create")]
    assert all(c.node == "spark1" for c in changes) and "127.0.0.1:18356" in changes[1].summary
    for line, want in ((running(spec), []), (running(spec).replace("true", "false", 1), ["start"]),
                            (running(spec).replace(spec.spec_hash(), "0" * 16), ["create"]),
                            (running(spec).replace("unless-stopped", "no"), ["create"])):
        kit = kit_of(inv)
        answering(kit, "spark1", SCRIPT_SHA, {"sparkctl-collector": line})
        assert [c.payload[1] for c in task.check(kit.cluster)] == want, line
    kit = kit_of(inv)
    answering(kit, "spark1", "0" * 64, {"sparkctl-collector": running(spec)})
    assert [c.payload for c in task.check(kit.cluster)] == [("sparkctl-collector", "script")]


def test_an_engine_that_keeps_its_own_counters_has_nothing_to_read(tmp_path):
    inv = inventory_from_yaml(PAIR.replace("qwen3-235b-eagle3", "llama-3.3-70b-vllm"), tmp_path)
    kit = kit_of(inv)
    assert ServeCollectorTask().check(kit.cluster) == []
    assert not [c for c in kit.transport("spark1").calls if c.kind == "run"]


def test_applying_puts_the_script_and_runs_the_world_s_container(tmp_path):
    inv = inventory_from_yaml(PAIR, tmp_path)
    kit = kit_of(inv)
    ServeCollectorTask().apply(kit.cluster, [Change("script", payload=("sparkctl-collector", "script")),
                                             Change("run", payload=("sparkctl-collector", "create"))])
    transport = kit.transport("spark1")
    puts = [c for c in transport.calls if c.kind == "put"]
    assert [(p.target.rsplit("/", 1)[-1], p.mode) for p in puts] == [("serve-collector.py", 0o644)]
    assert puts[0].content == collector_script()
    commands = [c.target for c in transport.calls if c.kind == "run"]
    assert any(c.startswith("docker run -d --name sparkctl-collector ") for c in commands)
    assert not any("nginx" in c for c in commands)
    kit = kit_of(inv)
    ServeCollectorTask().apply(kit.cluster, [Change("start", payload=("sparkctl-collector", "start"))])
    assert [c.target for c in kit.transport("spark1").calls if c.kind == "run"] == ["docker start sparkctl-collector"]
    assert not [c for c in kit.transport("spark1").calls if c.kind == "put"]


def test_each_tensorrt_llm_world_has_its_collector_on_its_head_beside_its_engine(tmp_path):
    inv = load_inventory(str(_write(tmp_path, THREE)))
    kit = kit_of(inv)
    plan = plan_cluster(inv, kit.cluster.facts_by_node())
    (first_node, first), (other_node, other) = planned(inv, kit)
    assert (first_node, first.container, first.host) == ("spark1", "sparkctl-collector", "127.0.0.1")
    # the world off the head: its engine answers on spark3's fabric address, and its collector beside it, where the
    # world's watchdog (on spark3) and the gateway (on spark1) reach it
    fabric_address = plan.hosts["oss"]
    assert fabric_address == str(plan.fabric.address_facing("spark3", "spark1")) != "10.0.0.13"
    assert (other_node, other.container, other.host) == ("spark3", "sparkctl-collector--oss", fabric_address)
    assert other.command()[1:5] == ["--engine", f"http://{fabric_address}:{other.engine_port}/metrics",
                                    "--listen", f"{fabric_address}:{other.port}"]
    assert other.port == other.engine_port + 1 and other.port != first.port
    launch = plan.launches["oss"]
    assert isinstance(launch, TrtllmLaunch)
    unit = launch.unit(inv.for_world(inv.worlds()[1]), "spark3", state_dir="/st", user="nvidia", fingerprint="f")
    assert unit.watchdog is not None and unit.watchdog.metrics == f"http://{fabric_address}:{other.port}/metrics"
    # the gateway's /metrics is the first world's
    assert gateway_spec(inv, spark_facts("spark1"), "/st", hosts=plan.hosts).metrics_port == first.port

    task = ServeCollectorTask()
    answering(kit, "spark1", "", {"sparkctl-collector": ""})
    answering(kit, "spark3", "", {"sparkctl-collector--oss": ""})
    changes = task.check(kit.cluster)
    assert [(c.node, c.payload) for c in changes] == [
        ("spark1", ("sparkctl-collector", "script")), ("spark1", ("sparkctl-collector", "create")),
        ("spark3", ("sparkctl-collector--oss", "script")), ("spark3", ("sparkctl-collector--oss", "create"))]
    assert not [c for c in kit.transport("spark2").calls if c.kind == "run"]  # a worker runs no collector
    task.apply(kit.cluster, changes)
    ran = [c.target for c in kit.transport("spark3").calls if c.kind == "run"]
    assert any(c.startswith("docker run -d --name sparkctl-collector--oss ") and f"{fabric_address}:{other.port}" in c
               for c in ran)
    # as planned, on both heads: nothing to do
    kit = kit_of(inv)
    answering(kit, "spark1", SCRIPT_SHA, {"sparkctl-collector": running(first)})
    answering(kit, "spark3", SCRIPT_SHA, {"sparkctl-collector--oss": running(other)})
    assert task.check(kit.cluster) == []


def test_a_world_s_mpirun_runs_on_its_own_nodes_its_head_first(tmp_path):
    inv = load_inventory(str(_write(tmp_path, THREE)))
    plan = plan_cluster(inv, {n.name: spark_facts(n.name) for n in inv.nodes})
    first, other = plan.launches[""], plan.launches["oss"]
    assert isinstance(first, TrtllmLaunch) and isinstance(other, TrtllmLaunch)
    assert (first.head, other.head) == ("spark1", "spark3")
    hosts = dict(zip(["spark1", "spark2", "spark3"], _hostfile_hosts(plan), strict=True))
    assert first.argv[1:5] == ["-np", "2", "--host", f"{hosts['spark1']},{hosts['spark2']}"]
    assert other.argv[1:5] == ["-np", "1", "--host", hosts["spark3"]]
    assert "/sparkctl/serve--oss/extra-llm-api-config.yml" in other.argv
    assert other.argv[other.argv.index("--host", 5) + 1] == plan.hosts["oss"]
    # one world on every node of the cluster, in its order: mpirun takes the hostfile as it is
    whole = load_inventory(str(_write(tmp_path, PAIR)))
    argv = plan_cluster(whole, {n: spark_facts(n) for n in ("spark1", "spark2")}).launch.argv
    assert "-np" not in argv and argv[:3] == ["mpirun", "--mca", "plm_rsh_pass_environ_mca_params"]


def test_a_collector_no_world_plans_on_a_node_is_retired_and_cluster_down_removes_every_one(tmp_path):
    inv = load_inventory(str(_write(tmp_path, THREE)))
    labelled = "\n".join(["trtllm-multinode", "sparkctl-gateway", "sparkctl-collector", "sparkctl-collector--oss",
                          "sparkctl-collector--old"])
    found = {}
    for node in ("spark1", "spark3"):
        kit = kit_of(inv)
        kit.transport(node).respond(r"docker ps -a", framed([("labelled", labelled)]))
        found[node] = [c.payload for c in ContainerRetireTask().check(kit.node(node))]
    # each head keeps its own world's collector; a removed world's, and another head's name, go
    assert found == {"spark1": ["sparkctl-collector--oss", "sparkctl-collector--old"],
                     "spark3": ["sparkctl-collector", "sparkctl-collector--old"]}
    # the engine switched to one that keeps its own counters: every collector goes
    vllm = inventory_from_yaml(PAIR.replace("qwen3-235b-eagle3", "llama-3.3-70b-vllm"), tmp_path)
    kit = kit_of(vllm)
    kit.transport("spark1").respond(r"docker ps -a", framed([("labelled", "vllm-multinode\nsparkctl-gateway\n"
                                                                          "sparkctl-collector")]))
    assert [c.payload for c in ContainerRetireTask().check(kit.node("spark1"))] == ["sparkctl-collector"]
    kit = kit_of(inv)
    kit.transport("spark3").respond(r"docker ps -a", "sparkctl-collector--oss\ntrtllm-multinode\n")
    assert [c.payload for c in GatewayRemoveTask().check(kit.node("spark3"))] == ["sparkctl-collector--oss"]
    assert is_collector("sparkctl-collector--oss") and not is_collector("sparkctl-collectors")


def _write(tmp_path, text: str):
    path = tmp_path / "inv.yaml"
    path.write_text(text.lstrip())
    return path


def _hostfile_hosts(plan) -> list[str]:
    return [line.split()[0] for line in plan.hostfile.splitlines() if line.strip() and not line.startswith("#")]


def test_the_gateway_s_metrics_are_the_first_world_s_collector_wherever_it_runs(tmp_path):
    """The first model placed off the cluster's head: the gateway's /metrics goes to its collector over the fabric."""
    first_off_head = THREE.replace("    - {preset: qwen3-235b-eagle3, nodes: [spark1, spark2]}\n", "") + \
        "    - {preset: qwen3-235b-eagle3, nodes: [spark1, spark2]}\n"
    inv = load_inventory(str(_write(tmp_path, first_off_head)))
    kit = kit_of(inv)
    plan = plan_cluster(inv, kit.cluster.facts_by_node())
    ((node, first), _) = planned(inv, kit)
    assert (node, first.host) == ("spark3", plan.hosts[""]) and first.host != "127.0.0.1"
    spec = gateway_spec(inv, spark_facts("spark1"), "/st", hosts=plan.hosts)
    assert (spec.metrics_host, spec.metrics_port) == (first.host, first.port)
    assert f"proxy_pass http://{first.host}:{first.port};" in spec.config(KEY)


def test_two_worlds_on_one_head_write_the_script_once_and_one_failing_does_not_stop_the_other(tmp_path):
    text = THREE.replace("nodes: [spark3]}", "nodes: [spark1]}").replace(
        "{preset: gpt-oss-120b-eagle3", "{model: nvidia/Llama-3.1-8B-Instruct-FP4, engine: trtllm")
    inv = load_inventory(str(_write(tmp_path, text)))
    kit = kit_of(inv)
    (_, first), (node, other) = planned(inv, kit)
    assert node == "spark1" and other.container == "sparkctl-collector--oss"
    answering(kit, "spark1", "", {"sparkctl-collector": "", "sparkctl-collector--oss": ""})
    task = ServeCollectorTask()
    changes = task.check(kit.cluster)
    assert [c.payload for c in changes] == [("sparkctl-collector", "script"), ("sparkctl-collector", "create"),
                                            ("sparkctl-collector--oss", "create")]
    # the first one's `docker run` fails: the other is still made, and the failure is the task's
    kit.transport("spark1").respond(r"docker run -d --name sparkctl-collector --", "", exit_code=125)
    with pytest.raises(TaskFailed, match="docker run sparkctl-collector"):
        task.apply(kit.cluster, changes)
    ran = [c.target for c in kit.transport("spark1").calls if c.kind == "run"]
    assert any(c.startswith("docker run -d --name sparkctl-collector--oss ") for c in ran), ran


def test_an_inventory_that_serves_nothing_leaves_the_collectors_with_what_serves(tmp_path):
    bare = load_inventory(str(_write(tmp_path, PAIR.replace("serve: {preset: qwen3-235b-eagle3}\n", ""))))
    kit = kit_of(bare)
    kit.transport("spark1").respond(r"docker ps -a", framed([("labelled", "trtllm-multinode\nsparkctl-gateway\n"
                                                                          "sparkctl-collector\nvllm-multinode")]))
    assert [c.payload for c in ContainerRetireTask().check(kit.node("spark1"))] == ["vllm-multinode"]


def test_the_facts_labelled_list_needs_no_read_of_its_own(tmp_path):
    """Where the facts' one ask of docker's Engine API listed the cluster's containers, retire reads nothing more."""
    kit = kit_of(load_inventory(str(_write(tmp_path, THREE))))
    facts = kit.node("spark1").facts()
    facts.labelled_containers = ["trtllm-multinode", "sparkctl-gateway", "sparkctl-collector", "vllm-multinode"]
    assert [c.payload for c in ContainerRetireTask().check(kit.node("spark1"))] == ["vllm-multinode"]
    assert [c.target for c in kit.transport("spark1").calls if c.kind == "run"] == []
    facts.labelled_containers = None  # the CLI answered the facts: `docker ps` as before
    kit.transport("spark1").respond(r"docker ps -a", framed([("labelled", "trtllm-multinode\nsglang-multinode")]))
    assert [c.payload for c in ContainerRetireTask().check(kit.node("spark1"))] == ["sglang-multinode"]
