"""Several worlds on one cluster, planned: each world's names on its nodes (unit, dir, marker), the inventory as one
world sees it, and each world's launch (its own config file, an off-head API server on its fabric address)."""

from __future__ import annotations

import re

from sparkctl.inventory import load_inventory
from sparkctl.inventory.placement import world_key
from sparkctl.plan import plan_cluster
from sparkctl.plan.launches import is_our_server
from sparkctl.plan.vllm import VllmLaunch
from sparkctl.plan.world import WorldNames
from sparkctl.rules.serving import serving_enabled
from tests.unit.inventory_kit import TWO_VLLM_WORLDS, only_problem

VLLM_PAIR = TWO_VLLM_WORLDS


def test_the_first_world_keeps_the_names_a_cluster_of_one_model_had():
    first = WorldNames("duo")
    assert (first.unit_name, first.unit_path) == ("sparkctl-serve-duo.service",
                                                  "/etc/systemd/system/sparkctl-serve-duo.service")
    assert first.node_dir("/st") == "/st/run/serve"
    assert (first.container_dir, first.log, first.marker) == ("/sparkctl/serve", "run/serve/serve.log", "duo")
    other = WorldNames("duo", "gpt-oss-2")
    assert other.unit_name == "sparkctl-serve-duo--gpt-oss-2.service"
    assert other.node_dir("/st") == "/st/run/serve--gpt-oss-2"
    assert (other.in_container("vllm.yaml"), other.log, other.marker) == (
        "/sparkctl/serve--gpt-oss-2/vllm.yaml", "run/serve--gpt-oss-2/serve.log", "duo--gpt-oss-2")


def test_a_world_key_is_its_model_name_as_a_word():
    assert world_key("openai/gpt-oss-120b", 0) == "openai-gpt-oss-120b"
    assert world_key("Qwen/Qwen3.5-4B", 1) == "qwen-qwen3-5-4b-2"
    assert world_key("..", 0) == "model"
    assert len(world_key("a" * 128, 3)) <= 80


def test_every_world_has_a_key_of_its_own(inv_file):
    text = VLLM_PAIR.replace("nodes: [spark2]}", "replicas: 2}").replace("nodes: [spark1]}", "nodes: [spark1], "
                                                                          "vllm: {master_port: 29601}}")
    inv = load_inventory(inv_file(text))
    assert [(w.model, w.nodes, w.key) for w in inv.worlds()] == [
        ("Qwen/Qwen3-8B", ("spark1",), ""), ("small", ("spark2",), "small"), ("small", ("spark1",), "small-2")]


def test_two_names_that_make_one_word_are_refused(inv_file):
    text = VLLM_PAIR + """\
    - {model: Org/M.1, engine: vllm, nodes: [spark2], vllm: {master_port: 29601}}
    - {model: Org/M-1, engine: vllm, nodes: [spark2], vllm: {master_port: 29701}}
"""
    assert only_problem(inv_file(text)).startswith(
        "inv.yaml:11: serve.models[3].name: 'Org/M-1' makes the same unit and directory name ('org-m-1') as "
        "serve.models[2]'s 'Org/M.1': give this model a name of its own (name: ...)")


def test_the_inventory_as_one_world_sees_it(inv_file):
    inv = load_inventory(inv_file(VLLM_PAIR))
    first, second = inv.worlds()
    view = inv.for_world(second)
    assert view.world_key == "small" and inv.world_key == ""
    assert view.serving_nodes() == ["spark2"] and view.head.name == "spark1"
    assert view.serve_spec().served_name == "small" and view.serve_spec().model == "Qwen/Qwen3-4B"
    assert view.serve_spec().engine_port == 18357 and view.serve.port == 8355
    assert inv.for_world(first).serve_spec().model == "Qwen/Qwen3-8B"
    # the whole inventory is untouched
    assert inv.serve.models is not None and len(inv.serve.models) == 2


def test_each_world_is_planned_with_its_own_files_and_an_off_head_server_on_the_fabric(inv_file):
    inv = load_inventory(inv_file(VLLM_PAIR))
    plan = plan_cluster(inv)
    assert list(plan.launches) == ["", "small"] and plan.launch is plan.launches[""]
    head, other = plan.launches[""], plan.launches["small"]
    assert isinstance(head, VllmLaunch) and isinstance(other, VllmLaunch)
    assert head.host == "127.0.0.1" and list(head.serve) == ["spark1"]
    assert head.config_path == "/sparkctl/serve/vllm.yaml"
    # the gateway on spark1 reaches spark2's server over the fabric, never on the management network
    fabric_address = str(plan.fabric.address_facing("spark2", "spark1"))
    argv = other.serve["spark2"]
    assert argv[argv.index("--host") + 1] == other.host == fabric_address != "10.0.0.12"
    assert argv[argv.index("--config") + 1] == other.config_path == "/sparkctl/serve--small/vllm.yaml"
    assert argv[argv.index("--port") + 1] == "18357" and "--nnodes" not in argv

    view = inv.for_world(inv.worlds()[1])
    unit = other.unit(view, "spark2", state_dir="/home/nvidia/.local/state/sparkctl/sparks", user="nvidia",
                      fingerprint="f")
    assert unit.name == "sparkctl-serve-sparks--small.service"
    assert unit.serve_dir == "/home/nvidia/.local/state/sparkctl/sparks/run/serve--small"
    assert set(unit.files()) == {f"{unit.serve_dir}/{name}" for name in ("watchdog.py", "world.sh", "unit.sh")} | {
        "/etc/systemd/system/sparkctl-serve-sparks--small.service"}
    world = unit.world_text()
    assert "export SPARKCTL_WORLD=sparks--small" in world and "/sparkctl/serve--small/serve.pid" in world
    # its watchdog runs beside it and asks it where it answers
    assert unit.watchdog is not None and unit.watchdog.engine == f"http://{fabric_address}:18357"
    assert "/sparkctl/serve--small/world.sh" in unit.unit_text()
    # what each world's unit runs is its own, and ours either way
    assert re.search(unit.run.ours, shlex_line(argv)) and not re.search(head.unit_run(inv.for_world(
        inv.worlds()[0]), "spark1").ours, shlex_line(argv))
    assert is_our_server(shlex_line(argv)) and is_our_server(shlex_line(head.serve["spark1"]))


def test_a_world_leaves_the_others_processes_alone(inv_file):
    inv = load_inventory(inv_file(VLLM_PAIR))
    plan = plan_cluster(inv)
    script = plan.launches["small"].leftovers(WorldNames("sparks", "small"))
    assert "--config[ ]/sparkctl/serve--small/vllm.yaml" in script and '[ "$w" = sparks--small ]' in script


def shlex_line(argv: list[str]) -> str:
    return " ".join(argv)


def test_a_bare_inventory_s_world_serves_nothing(inv_file):
    inv = load_inventory(inv_file(VLLM_PAIR.split("container:")[0]))
    view = inv.for_world(inv.worlds()[0])
    assert not serving_enabled(inv) and not serving_enabled(view)
