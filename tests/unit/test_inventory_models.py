"""serve.models: several models on one cluster, each placed, checked as a whole (names, memory summed per node,
cabling, one engine, ports), and a plain serve: read as one model."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sparkctl.cli.main import cli
from sparkctl.inventory import dump_inventory, load_inventory
from sparkctl.inventory.model import SeveralModels
from sparkctl.plan.fabric import plan_fabric
from sparkctl.plan.vllm import vllm_launch
from tests.unit.inventory_kit import only_problem, problems_of

NODES = """\
user: nvidia
nodes:
  - {name: spark1, host: 10.0.0.11}
  - {name: spark2, host: 10.0.0.12}
  - {name: spark3, host: 10.0.0.13}
  - {name: spark4, host: 10.0.0.14}
fabric: {topology: switch}
"""
BIG_AND_SMALL = NODES + """\
serve:
  models:
    - preset: qwen3-235b-eagle3
      nodes: [spark1, spark2]
    - preset: gpt-oss-120b-eagle3
      name: gpt-oss
      aliases: [oss]
      replicas: 2
"""


def _worlds(inv) -> dict[str, list[tuple[str, ...]]]:
    return {m.name: [w.nodes for w in m.worlds] for m in inv.served_models()}


def test_a_plain_serve_is_one_model_with_one_world(inv_file):
    inv = load_inventory(inv_file(NODES + "serve: {preset: qwen3-235b-eagle3}\n"))
    (model,) = inv.served_models()
    assert model.name == "nvidia/Qwen3-235B-A22B-FP4" and model.loc == ("serve",)
    assert [w.nodes for w in model.worlds] == [("spark1", "spark2")]


def test_replicas_go_where_the_most_memory_is_left_each_on_its_own_node(inv_file):
    inv = load_inventory(inv_file(BIG_AND_SMALL))
    assert _worlds(inv) == {"nvidia/Qwen3-235B-A22B-FP4": [("spark1", "spark2")],
                            "gpt-oss": [("spark3",), ("spark4",)]}
    big, small = inv.served_models()
    assert small.aliases == ("oss",) and small.spec.served_name == "gpt-oss"
    # every engine has its own port (and the collector's after it)
    assert (big.spec.port, big.spec.engine_port, small.spec.port, small.spec.engine_port) == (8355, 18355, 8355, 18357)


def test_memory_is_summed_per_node_and_refused_at_its_line_with_the_numbers(inv_file):
    text = BIG_AND_SMALL.replace("replicas: 2", "replicas: 3")
    problem = only_problem(inv_file(text))
    assert problem.startswith("inv.yaml:12: serve.models[1]: spark1 would hold nvidia/Qwen3-235B-A22B-FP4 71.5 GB + "
                              "gpt-oss 70.0 GB = 141.5 GB, a Spark has 127.8 GB usable"), problem
    # fit_check: warn on every model there lets it through (memory sparkctl misjudges)
    warned = text.replace("      replicas: 3", "      replicas: 3\n      fit_check: warn").replace(
        "      nodes: [spark1, spark2]", "      nodes: [spark1, spark2]\n      fit_check: warn")
    assert len(_worlds(load_inventory(inv_file(warned)))["gpt-oss"]) == 3


def test_a_model_that_fits_elsewhere_is_told_where(inv_file):
    text = NODES + """\
serve:
  models:
    - {preset: qwen3-235b-eagle3, nodes: [spark1, spark2]}
    - {preset: gpt-oss-120b-eagle3, nodes: [spark2]}
"""
    assert only_problem(inv_file(text)).endswith("place openai/gpt-oss-120b on spark3 (nodes: [spark3])")


def test_two_models_answering_to_one_name_are_refused(inv_file):
    text = NODES + """\
serve:
  models:
    - {preset: gpt-oss-120b-eagle3, nodes: [spark1]}
    - {preset: gpt-oss-120b-eagle3, nodes: [spark2]}
"""
    assert "serve.models[1]: 'openai/gpt-oss-120b' is a name of serve.models[0] too (the repo id" in \
        only_problem(inv_file(text))
    aliased = text.replace("nodes: [spark2]}", "nodes: [spark2], name: b, aliases: [openai/gpt-oss-120b]}")
    assert "serve.models[1].aliases[0]: 'openai/gpt-oss-120b' is a name of serve.models[0] too" in \
        only_problem(inv_file(aliased))


def test_names_are_plain_words(inv_file):
    text = NODES + "serve:\n  models:\n    - {preset: gpt-oss-120b-eagle3, name: \"a b;$(id)\"}\n"
    assert "serve.models[0].name: not a model name clients can ask for" in only_problem(inv_file(text))


def test_the_models_of_a_cluster_share_its_engine(inv_file):
    text = NODES + """\
serve:
  models:
    - {preset: gpt-oss-120b-eagle3, nodes: [spark1]}
    - {model: Qwen/Qwen3-8B, engine: vllm, nodes: [spark2]}
"""
    assert "serve.models[1].engine: runs on vLLM, serve.models[0] on TensorRT-LLM" in only_problem(inv_file(text))


def test_a_model_setting_beside_serve_models_is_refused_at_its_line(inv_file):
    text = BIG_AND_SMALL.replace("serve:\n", "serve:\n  tp_size: 2\n")
    assert only_problem(inv_file(text)).startswith("inv.yaml:9: serve.tp_size: is about one model: with serve.models")


def test_replicas_are_one_node_copies_on_enough_nodes(inv_file):
    both = BIG_AND_SMALL.replace("replicas: 2", "replicas: 2\n      nodes: [spark3]")
    assert "serve.models[1].replicas: and nodes both set" in only_problem(inv_file(both))
    wide = NODES + "serve:\n  models:\n    - {preset: qwen3-235b-eagle3, replicas: 2}\n"
    assert "serve.models[0].replicas: are one-node copies, and this model's world has 2 ranks" in \
        only_problem(inv_file(wide))
    many = NODES + "serve:\n  models:\n    - {model: Qwen/Qwen3-8B, tp_size: 1, replicas: 5}\n"
    assert "5 replicas need 5 nodes, the inventory has 4" in only_problem(inv_file(many))


def test_an_entry_is_checked_like_a_plain_serve_at_its_own_lines(inv_file):
    text = BIG_AND_SMALL.replace("      nodes: [spark1, spark2]", "      nodes: [spark1, spark9]")
    assert only_problem(inv_file(text)).startswith("inv.yaml:11: serve.models[0].nodes[1]: no node named 'spark9'")
    # one of several models need not hold the head: the gateway reaches its world
    elsewhere = BIG_AND_SMALL.replace("nodes: [spark1, spark2]", "nodes: [spark3, spark4]")
    assert _worlds(load_inventory(inv_file(elsewhere)))["gpt-oss"] == [("spark1",), ("spark2",)]


def test_engine_ports_of_their_own(inv_file):
    text = BIG_AND_SMALL.replace("      replicas: 2", "      replicas: 2\n      engine_port: 18355")
    assert "serve.models[1].engine_port: the engine's port 18355 is serve.models[0]'s too" in \
        only_problem(inv_file(text))


def test_vllm_worlds_sharing_a_head_meet_on_ports_of_their_own(inv_file):
    text = NODES + """\
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, tp_size: 2, nodes: [spark1, spark2]}
    - {model: Qwen/Qwen3-4B, engine: vllm, tp_size: 2, nodes: [spark1, spark3]}
"""
    assert "serve.models[1].vllm.master_port: 29501 is where serve.models[0]'s ranks meet on spark1 too" in \
        only_problem(inv_file(text))
    apart = text.replace("nodes: [spark1, spark3]}", "nodes: [spark1, spark3], vllm: {master_port: 29601}}")
    assert len(load_inventory(inv_file(apart)).served_models()) == 2


def test_on_a_ring_a_world_is_made_of_neighbours(inv_file):
    text = NODES.replace("topology: switch", "topology: ring") + """\
serve:
  models:
    - {model: Qwen/Qwen3-8B, tp_size: 2, nodes: [spark1, spark3]}
    - {model: Qwen/Qwen3-4B, nodes: [spark2]}
"""
    problem = only_problem(inv_file(text))
    assert "serve.models[0].nodes: spark1 and spark3 are not cabled to each other" in problem
    assert problem.endswith("place the world on neighbours, e.g. [spark1, spark2]")
    # spark4 and spark1 close the ring
    assert load_inventory(inv_file(text.replace("[spark1, spark3]", "[spark4, spark1]")))
    # three of a ring's four nodes: two of them are never cabled to each other
    three = text.replace("tp_size: 2, nodes: [spark1, spark3]", "tp_size: 3, nodes: [spark1, spark2, spark3]")
    three = three.replace("nodes: [spark2]}", "nodes: [spark4]}")
    assert "always holds two that are not cabled to each other: use 2 neighbours or the whole ring" in \
        only_problem(inv_file(three))


def test_one_entry_serves_as_a_plain_serve_under_its_name(inv_file):
    text = NODES + """\
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, tp_size: 2, name: qwen, aliases: [q8]}
"""
    inv = load_inventory(inv_file(text))
    assert inv.serve.tp_size == 2 and inv.engine().name == "vllm" and inv.container.name == "vllm-multinode"
    assert inv.serve_spec().served_name == "qwen" and inv.serving_nodes() == ["spark1", "spark2"]
    argv = vllm_launch(inv, plan_fabric(inv)).serve["spark1"]
    at = argv.index("--served-model-name")
    assert argv[at + 1:at + 3] == ["qwen", "q8"]
    # what was written is what is dumped
    assert "tp_size" not in dump_inventory(inv).split("models:")[0]


def test_validate_shows_the_placement_and_the_plan_serves_every_tensorrt_llm_world(inv_file):
    path = inv_file(BIG_AND_SMALL)
    runner = CliRunner()
    shown = runner.invoke(cli, ["inventory", "validate", path])
    assert shown.exit_code == 0, shown.output
    assert "  model gpt-oss (also oss): trtllm, tp_size 1, on spark3, spark4" in shown.output
    assert "  node spark3: gpt-oss (70.0 of 127.8 GB)" in shown.output
    report = json.loads(runner.invoke(cli, ["inventory", "validate", "--json", path]).output)
    assert report["models"][1]["worlds"] == [["spark3"], ["spark4"]]
    # each world's mpirun on its own nodes from its head's container, each with its figures collector beside it
    planned = runner.invoke(cli, ["cluster", "plan", path])
    assert planned.exit_code == 0, planned.output
    lines = planned.output.splitlines()
    launches = [line.split(" --mca")[0] for line in lines if line.startswith("mpirun ")]
    assert launches == ["mpirun -np 2 --host 192.168.100.10,192.168.100.11", "mpirun -np 1 --host 192.168.100.12",
                        "mpirun -np 1 --host 192.168.100.13"]
    collectors = [line.split(" (")[0] for line in lines if line.startswith("--- figures collector")]
    assert collectors == ["--- figures collector sparkctl-collector on spark1",
                          "--- figures collector sparkctl-collector--gpt-oss on spark3",
                          "--- figures collector sparkctl-collector--gpt-oss-2 on spark4"]


def test_every_problem_of_several_entries_at_once(inv_file):
    text = NODES + """\
serve:
  models:
    - {preset: gpt-oss-120b-eagle3, tp_size: 9}
    - {preset: gpt-oss-120b-eagle3, nodes: [spark7]}
"""
    problems = problems_of(inv_file(text))
    assert any("inv.yaml:10: serve.models[0].tp_size: tp_size 9 needs 9 nodes" in p for p in problems), problems
    assert any("inv.yaml:11: serve.models[1].nodes[0]: no node named 'spark7'" in p for p in problems), problems


def test_one_entry_of_its_own_serves_the_world_placement_planned(inv_file):
    """A model of its own without tp_size: one rank per named node, or per replica, as validate placed it."""
    vllm = NODES + 'container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}\n'
    one = load_inventory(inv_file(vllm + "serve:\n  models:\n    - {model: Qwen/Qwen3-8B, engine: vllm, "
                                         "replicas: 1}\n"))
    assert one.serve_spec().tp_size == 1 and one.serving_nodes() == ["spark1"]
    assert [w.nodes for w in one.served_models()[0].worlds] == [("spark1",)]
    named = load_inventory(inv_file(vllm + "serve:\n  models:\n    - {model: Qwen/Qwen3-8B, engine: vllm, "
                                           "nodes: [spark1, spark2]}\n"))
    assert named.serve_spec().tp_size == 2 and named.serving_nodes() == ["spark1", "spark2"]


def test_several_models_answer_their_engine_and_refuse_one_spec_for_all(inv_file):
    """serve:'s own model fields are unset beside models: the engine is the entries' (one per cluster, checked), and
    a question with one answer per model fails loudly instead of answering with the default preset's model."""
    inv = load_inventory(inv_file(NODES + """\
serve:
  models:
    - {model: openai/gpt-oss-120b, engine: vllm, nodes: [spark1, spark2], tp_size: 2}
    - {model: Qwen/Qwen3-8B, engine: vllm, name: small, nodes: [spark3]}
"""))
    assert inv.engine().name == "vllm" and inv.container.name == inv.engine().container_name
    with pytest.raises(SeveralModels):
        inv.serve_spec()
    assert [m.name for m in inv.served_models()] == ["openai/gpt-oss-120b", "small"]
    one = load_inventory(inv_file(NODES + """\
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, name: small, nodes: [spark1]}
"""))
    assert one.engine().name == "vllm" and one.serve_spec().served_name == "small"


def test_a_model_appended_moves_none_placed_before_it(inv_file):
    vllm = NODES + 'container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}\nserve:\n  models:\n' \
        '    - {model: Qwen/Qwen3-4B, engine: vllm, name: small, replicas: 2}\n'
    before = _worlds(load_inventory(inv_file(vllm)))
    after = _worlds(load_inventory(inv_file(vllm + "    - {model: Qwen/Qwen3-8B, engine: vllm, nodes: [spark1]}\n")))
    assert before["small"] == after["small"] == [("spark1",), ("spark2",)]
    assert after["Qwen/Qwen3-8B"] == [("spark1",)]


def test_one_repo_is_served_at_one_revision(inv_file):
    text = NODES + """\
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, nodes: [spark1]}
    - {model: Qwen/Qwen3-8B, engine: vllm, name: old, revision: v1.0, nodes: [spark2]}
"""
    assert only_problem(inv_file(text)).startswith(
        "inv.yaml:12: serve.models[1].revision: Qwen/Qwen3-8B is served at main by serve.models[0]: a node keeps one "
        "pinned commit of a repo")
    assert load_inventory(inv_file(text.replace("revision: v1.0", "revision: main")))


def test_two_ray_worlds_never_share_a_node(inv_file):
    text = NODES + """\
container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}
serve:
  models:
    - {model: Qwen/Qwen3-8B, engine: vllm, tp_size: 2, nodes: [spark1, spark2], vllm: {executor: ray}}
    - {model: Qwen/Qwen3-4B, engine: vllm, tp_size: 2, nodes: [spark2, spark3],
       vllm: {executor: ray, master_port: 29601, ray_port: 6380}}
"""
    assert "serve.models[1].vllm.executor: runs on Ray on spark2, as serve.models[0] does: a Ray world stops every " \
           "Ray of the node's container when it ends" in only_problem(inv_file(text))
    apart = text.replace("nodes: [spark2, spark3]", "nodes: [spark3, spark4]")
    assert len(load_inventory(inv_file(apart)).worlds()) == 2
    # one Ray world beside an mp one is fine: ray stop ends Ray's processes only
    mixed = text.replace("vllm: {executor: ray, master_port", "vllm: {executor: mp, master_port")
    assert len(load_inventory(inv_file(mixed)).worlds()) == 2
