from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from textwrap import dedent

import pytest

from sparkctl.errors import InventoryError
from sparkctl.inventory import (
    Inventory,
    dump_inventory,
    inventory_json_schema,
    load_inventory,
)
from tests.unit.inventory_kit import PAIR, only_problem, problems_of

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "inventories").glob("*.yaml"))
FIXTURES = REPO / "tests" / "fixtures" / "inventories"
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"

# -- reading the file ------------------------------------------------------------------------------

def test_missing_file(inv_file):
    assert only_problem("nope.yaml") == "nope.yaml: file not found (check the path)"


def test_directory_and_undecodable_file(inv_file, tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    assert only_problem("dir.yaml").startswith("dir.yaml: is a directory")
    (tmp_path / "latin1.yaml").write_bytes(b"user: caf\xe9\n")
    assert only_problem("latin1.yaml").startswith("latin1.yaml: cannot read:")


def test_yaml_syntax_error_has_its_line():
    problem = only_problem(FIXTURES / "yaml-syntax-error.yaml")
    assert problem.startswith(f"{FIXTURES / 'yaml-syntax-error.yaml'}:5: YAML syntax error:")


@pytest.mark.parametrize("text, kind", [("", "an empty file"), ("just text\n", "a string")])
def test_top_level_not_a_mapping(inv_file, text, kind):
    assert only_problem(inv_file(text)).startswith(f"inv.yaml:1: top level: expected a mapping with `user:` "
                                                   f"and `nodes:`, got {kind}")
    assert "got a list" in only_problem(FIXTURES / "not-a-mapping.yaml")


# -- schema: keys, types, required fields ----------------------------------------------------------

def test_unknown_key_with_did_you_mean(inv_file):
    path = inv_file("""\
        user: nvidia
        nodes:
          - name: spark1
            host: 10.0.0.11
          - name: spark2
            host: 10.0.0.12
            hots: 10.0.0.13
        """)
    assert only_problem(path) == "inv.yaml:7: nodes[1].hots: unknown key (did you mean 'host'?)"


def test_unknown_key_without_close_match_lists_allowed(inv_file):
    path = inv_file(PAIR + "fabric:\n  colour: blue\n")
    assert only_problem(path) == ("inv.yaml:8: fabric.colour: unknown key (allowed here: topology, port, "
                                  "subnets, mtu, netplan_file)")


def test_wrong_types(inv_file):
    path = inv_file("""\
        user: nvidia
        ssh:
          port: twenty-two
        nodes:
          - name: spark1
            host: [10.0.0.11]
        """)
    assert problems_of(path) == [
        "inv.yaml:3: ssh.port: wrong type: expected a valid integer, got a string"
        " (write a whole number without quotes, e.g. 2233)",
        "inv.yaml:6: nodes[0].host: wrong type: expected a valid string, got a list"
        " (write text, quoted if it could read as a number or true/false)",
    ]


def test_missing_required_fields(inv_file):
    path = inv_file("""\
        cluster: {name: lab}
        nodes:
          - name: spark1
        """)
    assert problems_of(path) == [
        "inv.yaml:1: user: required field missing (add it: the SSH user, the same on every node)",
        "inv.yaml:3: nodes[0].host: required field missing (add it: the management address or an "
        "~/.ssh/config alias)",
    ]


def test_empty_nodes_and_bad_names(inv_file):
    assert only_problem(inv_file("user: nvidia\nnodes: []\n")) == (
        "inv.yaml:2: nodes: needs at least one node (list the Sparks, head first)")
    path = inv_file("cluster: {name: My_Cluster}\nuser: nvidia\nnodes:\n  - {name: Spark1, host: -oProxy}\n")
    problems = problems_of(path)
    assert problems[0].startswith("inv.yaml:1: cluster.name: lowercase letters")
    assert problems[1].startswith("inv.yaml:4: nodes[0].name: 'Spark1' is not a node name")
    assert problems[2] == ("inv.yaml:4: nodes[0].host: must not start with '-' "
                           "(it would be read as an ssh option)")


def test_duplicate_yaml_key(inv_file):
    path = inv_file(PAIR + "user: admin\n")
    assert only_problem(path) == ("inv.yaml:7: user: duplicate key, line 1 has it too (YAML keeps only the "
                                  "last one: remove one)")


# -- nodes -----------------------------------------------------------------------------------------

def test_duplicate_node_names_and_hosts(inv_file):
    path = inv_file("""\
        user: nvidia
        nodes:
          - name: spark1
            host: 10.0.0.11
          - name: spark1
            host: 10.0.0.11
        """)
    assert problems_of(path) == [
        "inv.yaml:5: nodes[1].name: duplicate node name 'spark1', also nodes[0] "
        "(give each node its own name)",
        "inv.yaml:6: nodes[1].host: duplicate host 10.0.0.11, also nodes[0] (spark1) "
        "(each node needs its own management address)",
    ]


def test_same_host_on_other_ports_is_allowed(inv_file):
    inv = load_inventory(inv_file("""\
        user: nvidia
        nodes:
          - {name: spark1, host: 127.0.0.1, port: 2201}
          - {name: spark2, host: 127.0.0.1, port: 2202}
        """))
    assert [inv.ssh_target(n).port for n in inv.nodes] == [2201, 2202]


def test_pinned_interfaces(inv_file):
    path = inv_file(PAIR + dedent("""\
          - name: spark3
            host: 10.0.0.13
            fabric: {interfaces: [wlP9s9, enP2p1s0f1np1]}
          - name: spark4
            host: 10.0.0.14
            fabric:
              interfaces: [enp1s0f1np1]
        fabric: {topology: switch}
        """))
    assert problems_of(path) == [
        "inv.yaml:9: nodes[2].fabric.interfaces: wlP9s9 is the Wi-Fi interface, never a fabric interface "
        "(name the two CX-7 twins, see `ibdev2netdev`)",
        "inv.yaml:13: nodes[3].fabric.interfaces: needs exactly 2 different names, 1 given (the two twins of "
        "the cabled port, e.g. [enp1s0f1np1, enP2p1s0f1np1])",
    ]


# -- fabric ----------------------------------------------------------------------------------------

def test_invalid_subnets(inv_file):
    path = inv_file(PAIR + "fabric:\n  subnets:\n    - 192.168.100.1/24\n    - not-a-net\n")
    assert problems_of(path) == [
        "inv.yaml:9: fabric.subnets[0]: has host bits set (did you mean 192.168.100.0/24?)",
        "inv.yaml:10: fabric.subnets[1]: not an IPv4 subnet (write it like 192.168.100.0/24)",
    ]


def test_overlapping_subnets(inv_file):
    path = inv_file(PAIR + "fabric:\n  subnets:\n    - 192.168.100.0/24\n    - 192.168.100.128/25\n")
    assert only_problem(path) == (
        "inv.yaml:10: fabric.subnets[1]: 192.168.100.128/25 overlaps 192.168.100.0/24 (subnets[0]) "
        "(each twin needs its own subnet: two interfaces in one subnet confuse routing and NCCL)")


def test_subnet_containing_a_management_host(inv_file):
    path = inv_file(PAIR + "fabric:\n  subnets: [192.168.100.0/24, 10.0.0.0/16]\n")
    problems = problems_of(path)
    assert problems == [
        "inv.yaml:8: fabric.subnets[1]: 10.0.0.0/16 overlaps the management network: node spark1 is "
        "reached at 10.0.0.11 (choose fabric.subnets apart from the management addresses)",
        "inv.yaml:8: fabric.subnets[1]: 10.0.0.0/16 overlaps the management network: node spark2 is "
        "reached at 10.0.0.12 (choose fabric.subnets apart from the management addresses)",
    ]


def test_default_subnets_overlapping_the_management_network_point_at_the_hosts():
    path = FIXTURES / "management-overlap.yaml"
    problems = problems_of(path)
    assert [p.split(": ")[0:2] for p in problems] == [[f"{path}:5", "nodes[0].host"],
                                                        [f"{path}:7", "nodes[1].host"]]
    assert all("192.168.100.0/24 overlaps the management network" in p for p in problems)


def test_wrong_number_of_subnets(inv_file):
    path = inv_file(PAIR + "fabric:\n  subnets: [192.168.100.0/24]\n")
    assert only_problem(path) == (
        "inv.yaml:8: fabric.subnets: pair of 2 node(s) needs 2 subnets, 1 given (one per twin of the cabled "
        "port; or leave fabric.subnets out for the defaults)")
    ring = inv_file(PAIR + "  - {name: spark3, host: 10.0.0.13}\nfabric:\n  topology: ring\n"
                    "  subnets: [10.1.0.0/24, 10.1.1.0/24]\n")
    assert "fabric.subnets: ring of 3 node(s) needs 6 subnets, 2 given" in only_problem(ring)


@pytest.mark.parametrize("topology, nodes, expected", [
    ("single", 2, "single needs exactly 1 node, the inventory has 2 (use pair for 2 nodes, ring or switch "
                  "for more)"),
    ("pair", 3, "pair needs exactly 2 nodes, the inventory has 3 (use single for 1 node, ring or switch for "
                "more)"),
    ("ring", 2, "ring needs 3 to 8 nodes, the inventory has 2 (use single for 1 node, pair for 2)"),
    ("ring", 9, "a ring of 9 nodes cannot work well: its farthest nodes would be 4 hops apart, relayed by the "
                "nodes in between; sparkctl builds rings of 3 to 8 (use a switch)"),
    ("switch", 1, "switch needs 2 or more nodes, the inventory has 1 (use single for 1 node)"),
])
def test_topology_that_does_not_fit(inv_file, topology, nodes, expected):
    node_lines = "".join(f"  - {{name: spark{i}, host: 10.0.0.{i}}}\n" for i in range(nodes))
    path = inv_file(f"user: nvidia\nnodes:\n{node_lines}fabric:\n  topology: {topology}\n"
                    "serve: {tp_size: 1}\n")
    assert only_problem(path) == f"inv.yaml:{nodes + 4}: fabric.topology: {expected}"


def test_a_ring_uses_both_ports_not_one_and_not_two_pinned_twins(inv_file):
    three = PAIR + "  - {name: spark3, host: 10.0.0.13}\n"
    port = inv_file(three + "fabric:\n  topology: ring\n  port: 1\n")
    assert only_problem(port) == ("inv.yaml:10: fabric.port: a ring uses both ports of every node (port 0 to the "
                                  "next node, port 1 to the previous), not port 1 alone (remove fabric.port)")
    pinned = inv_file(PAIR.replace("    host: 10.0.0.11\n", "    host: 10.0.0.11\n    fabric: {interfaces: "
                                   "[enp1s0f0np0, enP2p1s0f0np0]}\n")
                      + "  - {name: spark3, host: 10.0.0.13}\nfabric:\n  topology: ring\n")
    assert "nodes[0].fabric.interfaces: spark1: a ring uses the four twins of both ports" in only_problem(pinned)


def test_three_nodes_need_a_topology(inv_file):
    path = inv_file(PAIR + "  - {name: spark3, host: 10.0.0.13}\n")
    assert only_problem(path).startswith("inv.yaml:1: fabric.topology: required for 3 nodes (ring: port 0")


def test_unknown_topology_did_you_mean(inv_file):
    path = inv_file(PAIR + "fabric: {topology: rign}\n")
    assert only_problem(path) == "inv.yaml:7: fabric.topology: 'rign' is not allowed (did you mean 'ring'?)"


# -- serve -----------------------------------------------------------------------------------------

def test_unknown_preset_did_you_mean(inv_file):
    path = inv_file(PAIR + "serve:\n  preset: qwen3-235b-eagel3\n")
    assert only_problem(path) == ("inv.yaml:8: serve.preset: unknown preset 'qwen3-235b-eagel3' "
                                  "(did you mean 'qwen3-235b-eagle3'?)")
    bad_variant = inv_file(PAIR + "serve:\n  preset: gpt-oss-120b-eagle3:v9\n")
    assert "has no variant 'v9' (variants: long-context, v2, throughput, v3)" in only_problem(bad_variant)


def test_fewer_nodes_than_tp_size(inv_file):
    path = inv_file(PAIR + "serve:\n  tp_size: 4\n")
    assert only_problem(path) == ("inv.yaml:8: serve.tp_size: tp_size 4 needs 4 nodes, the inventory has 2 "
                                  "(add nodes, or set serve.tp_size to 2 or less)")
    single = inv_file("user: nvidia\nnodes: [{name: spark1, host: h1}]\n"
                      "serve:\n  preset: qwen3-235b-eagle3\n")
    assert only_problem(single) == (
        "inv.yaml:4: serve.preset: tp_size 2 (from preset qwen3-235b-eagle3) needs 2 nodes, the inventory "
        "has 1 (add nodes, or set serve.tp_size to 1 or less)")


def test_decoding_without_a_draft(inv_file):
    path = inv_file(PAIR + "serve:\n  model: org/some-model\n  decoding: eagle3\n")
    assert only_problem(path) == ("inv.yaml:9: serve.decoding: eagle3 needs a draft model (set serve.draft, "
                                  "or decoding: none)")
    fine = load_inventory(inv_file(PAIR + "serve:\n  model: org/some-model\n  decoding: none\n"))
    assert fine.serve_spec().draft is None


def test_max_draft_len_must_be_positive(inv_file):
    path = inv_file(PAIR + "serve:\n  max_draft_len: 0\n")
    assert only_problem(path) == "inv.yaml:8: serve.max_draft_len: must be greater than 0 (set a number in that range)"


# -- secrets ---------------------------------------------------------------------------------------

def test_pasted_token_is_refused_and_never_echoed():
    path = FIXTURES / "token-pasted.yaml"
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    text = str(caught.value)
    assert TOKEN not in text and TOKEN not in repr(caught.value.problems)
    assert caught.value.problems == [
        f"{path}:8: container.env.HF_TOKEN: a secret in the inventory is refused (secrets are never stored "
        "in the inventory: export it in your shell; for the Hugging Face token serve.hf_token_env names the "
        "variable)",
        f"{path}:10: serve.hf_token_env: looks like a token: put the NAME of the environment variable here "
        "and export the token in it (e.g. hf_token_env: HF_TOKEN, then `export HF_TOKEN=...`)",
    ]


def test_token_never_echoed_by_the_model_either():
    with pytest.raises(ValueError) as caught:
        Inventory.model_validate({"user": "u", "nodes": [{"name": "a", "host": "h"}],
                                  "serve": {"hf_token_env": TOKEN}})
    assert TOKEN not in str(caught.value)


def test_a_token_anywhere_is_never_echoed(inv_file):
    path = inv_file(f"user: nvidia\nnodes:\n  - {{name: spark1, host: {TOKEN}}}\n  - {{name: spark2, host: {TOKEN}}}\n"
                    f"  - {{name: {TOKEN}, host: h3}}\nfabric: {{topology: switch}}\nserve: {{preset: {TOKEN}}}\n")
    problems = problems_of(path)
    assert [p.split(": ")[1] for p in problems] == ["nodes[0].host", "nodes[1].host", "nodes[2].name", "serve.preset"]
    assert TOKEN not in "\n".join(problems) and all("a secret in the inventory is refused" in p for p in problems)


def test_hf_token_env_must_be_a_variable_name(inv_file):
    path = inv_file(PAIR + "serve:\n  hf_token_env: my token\n")
    assert only_problem(path).startswith("inv.yaml:8: serve.hf_token_env: looks like a token: put the NAME")
    fine = load_inventory(inv_file(PAIR + "serve:\n  hf_token_env: MY_HF_TOKEN\n"))
    assert fine.serve_spec().hf_token_env == "MY_HF_TOKEN"


def test_secrets_in_container_env_and_docker_args(inv_file):
    path = inv_file(PAIR + dedent("""\
        container:
          env:
            NCCL_DEBUG: INFO
            NCCL_IB_GID_INDEX: 3
            DB_PASSWORD: hunter2
            my_secret_thing: x
          docker_args: [--shm-size=1g, -e, WANDB_API_KEY=abc]
        """))
    problems = problems_of(path)
    assert [p.split(": ")[:2] for p in problems] == [
        ["inv.yaml:11", "container.env.DB_PASSWORD"],
        ["inv.yaml:12", "container.env.my_secret_thing"],
        ["inv.yaml:13", "container.docker_args[2]"],
    ]
    assert not any(word in "".join(problems) for word in ("hunter2", "=abc"))


# -- one pass --------------------------------------------------------------------------------------

def test_three_problems_three_lines():
    path = FIXTURES / "three-problems.yaml"
    assert problems_of(path) == [
        f"{path}:8: nodes[1].port: wrong type: expected a valid integer, got a string"
        " (write a whole number without quotes, e.g. 2233)",
        f"{path}:10: fabric.subnets[1]: 192.168.100.0/25 overlaps 192.168.100.0/24 (subnets[0]) (each twin "
        "needs its own subnet: two interfaces in one subnet confuse routing and NCCL)",
        f"{path}:13: serve.max_draft_len: must be greater than 0 (set a number in that range)",
    ]


# -- resolved defaults -----------------------------------------------------------------------------

def test_single_node_defaults(inv_file):
    inv = load_inventory(inv_file("user: nvidia\nnodes:\n  - {name: spark1, host: spark-1.local}\n"))
    assert (inv.topology, inv.fabric_subnets(), inv.head.name, inv.tp_size) == ("single", [], "spark1", 1)
    spec = inv.serve_spec()
    assert (spec.preset, spec.model, spec.draft, spec.port) == (
        "gpt-oss-120b-eagle3", "openai/gpt-oss-120b", "nvidia/gpt-oss-120b-Eagle3", 8000)
    assert spec.config["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
    assert inv.cluster.name == "sparks" and inv.container.ssh_port == 2233 and inv.fabric.mtu == 9000


def test_pair_defaults(inv_file):
    inv = load_inventory(inv_file(PAIR))
    assert inv.topology == "pair"
    assert inv.fabric_subnets() == [ipaddress.IPv4Network("192.168.100.0/24"),
                                    ipaddress.IPv4Network("192.168.101.0/24")]
    spec = inv.serve_spec()
    assert (spec.preset, spec.tp_size, spec.port, spec.max_draft_len, spec.weights_gb) == (
        "qwen3-235b-eagle3", 2, 8355, 3, 125)
    assert spec.config["speculative_config"] == {"decoding_type": "Eagle", "max_draft_len": 3}
    assert "speculative_model_dir" not in spec.config["speculative_config"]


def test_port_is_the_presets_unless_written(inv_file, tmp_path):
    single = "user: nvidia\nnodes: [{name: spark1, host: h1}]\n"
    assert load_inventory(inv_file(single)).serve_spec().port == 8000
    written = load_inventory(inv_file(single + "serve: {port: 8355}\n"))
    assert written.serve_spec().port == 8355
    again = tmp_path / "again.yaml"
    again.write_text(dump_inventory(written))
    assert load_inventory(again).serve_spec().port == 8355


def test_ring_default_subnets(inv_file):
    inv = load_inventory(inv_file(PAIR + "  - {name: spark3, host: 10.0.0.13}\nfabric: {topology: ring}\n"))
    assert [str(s) for s in inv.fabric_subnets()] == [f"192.168.{i}.0/24" for i in range(6)]


def test_serve_overrides_follow_into_the_config(inv_file):
    inv = load_inventory(inv_file(PAIR + dedent("""\
        serve:
          max_draft_len: 5
          config:
            kv_cache_config: {free_gpu_memory_fraction: 0.8}
            enable_iter_perf_stats: true
        """)))
    spec = inv.serve_spec()
    assert spec.config["speculative_config"]["max_draft_len"] == 5 == spec.max_draft_len
    assert spec.config["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False}
    assert spec.config["enable_iter_perf_stats"] is True
    plain = load_inventory(inv_file(PAIR + "serve: {decoding: none, tp_size: 1}\n")).serve_spec()
    assert (plain.draft, plain.max_draft_len, plain.tp_size) == (None, None, 1)
    assert "speculative_config" not in plain.config
    # the iteration stats top reads are on unless the user says otherwise
    assert plain.config["enable_iter_perf_stats"] is True
    off = load_inventory(inv_file(PAIR + "serve: {config: {enable_iter_perf_stats: false}}\n")).serve_spec()
    assert off.config["enable_iter_perf_stats"] is False


def test_explicit_model_without_preset(inv_file):
    inv = load_inventory(inv_file(PAIR + "serve: {model: org/m, draft: org/d, decoding: draft-target}\n"))
    spec = inv.serve_spec()
    assert (spec.preset, spec.tp_size, spec.port, spec.max_draft_len) == (None, 2, 8355, 4)
    assert spec.weights_gb is None
    assert spec.config == {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4},
                           "enable_iter_perf_stats": True}  # sparkctl's: top reads the iteration stats


def test_per_node_ssh_overrides_and_lines():
    inv = load_inventory(REPO / "inventories" / "four-sparks-switch.yaml")
    target = inv.ssh_target("spark4")
    assert (target.user, target.port, target.identity_file) == ("admin", 22, "~/.ssh/id_ed25519")
    assert inv.ssh_target(inv.head).user == "nvidia"
    assert inv.source == REPO / "inventories" / "four-sparks-switch.yaml"
    assert inv.line_of("nodes", 3, "user") == 24
    assert inv.line_of("fabric", "netplan_file") is None
    assert inv.where("fabric", "netplan_file") == f"{inv.source}:{inv.line_of('fabric')}"


# -- examples, schema, dump ------------------------------------------------------------------------

def test_examples_exist():
    assert {p.name for p in EXAMPLES} >= {"two-sparks.yaml", "three-sparks-ring.yaml",
                                          "four-sparks-switch.yaml", "single-spark.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_round_trips(path, tmp_path):
    inv = load_inventory(path)
    again = tmp_path / "again.yaml"
    again.write_text(dump_inventory(inv))
    assert load_inventory(again).model_dump() == inv.model_dump()


def test_two_spark_example_is_the_playbook():
    inv = load_inventory(REPO / "inventories" / "two-sparks.yaml")
    spec = inv.serve_spec()
    assert (inv.topology, spec.model, spec.draft, spec.tp_size, spec.port) == (
        "pair", "nvidia/Qwen3-235B-A22B-FP4", "nvidia/Qwen3-235B-A22B-Eagle3", 2, 8355)
    assert inv.container.image == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"


def test_schema_is_json():
    schema = json.loads(json.dumps(inventory_json_schema()))
    assert schema["required"] == ["user", "nodes"]
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"cluster", "user", "ssh", "nodes", "fabric", "container", "serve", "firewall"}


def test_model_validate_runs_the_cross_checks_too():
    with pytest.raises(ValueError, match="duplicate node name 'a'"):
        Inventory.model_validate({"user": "u", "nodes": [{"name": "a", "host": "h1"},
                                                         {"name": "a", "host": "h2"}]})


def test_hf_cache_must_be_absolute_or_under_home(tmp_path):
    path = tmp_path / "inv.yaml"
    path.write_text("user: nvidia\nnodes: [{name: a, host: 10.0.0.1}]\ncontainer:\n  hf_cache: .cache/hf\n")
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    (line,) = err.value.problems
    assert line.startswith(f"{path}:4: container.hf_cache: ") and "absolute path or start with ~/" in line


def test_serving_nodes_default_to_the_first_ranks_and_may_be_named(inv_file):
    ring = ("user: nvidia\nnodes: [{name: spark1, host: h1}, {name: spark2, host: h2}, {name: spark3, host: h3}]\n"
            "fabric: {topology: ring}\n")
    inv = load_inventory(inv_file(ring + "serve: {preset: qwen3-235b-eagle3}\n"))
    assert inv.serving_nodes() == ["spark1", "spark2"] and inv.serve_spec().world_size == 2
    named = load_inventory(inv_file(ring + "serve: {preset: qwen3-235b-eagle3, nodes: [spark1, spark3]}\n"))
    assert named.serving_nodes() == ["spark1", "spark3"]
    pipeline = load_inventory(inv_file(ring + "serve: {preset: qwen3-235b-eagle3, tp_size: 1, pp_size: 3}\n"))
    assert pipeline.serve_spec().world_size == 3 and pipeline.serving_nodes() == ["spark1", "spark2", "spark3"]


@pytest.mark.parametrize("serve, problem", [
    ("{preset: qwen3-235b-eagle3, nodes: [spark2, spark3]}", "serve.nodes[0]: must start with the head spark1"),
    ("{preset: qwen3-235b-eagle3, nodes: [spark1, spark9]}", "serve.nodes[1]: no node named 'spark9'"),
    ("{preset: qwen3-235b-eagle3, nodes: [spark1, spark1]}", "serve.nodes[1]: spark1 is listed twice"),
    ("{preset: qwen3-235b-eagle3, nodes: [spark1]}", "serve.nodes: lists 1 node(s), the launch has 2 rank(s)"),
    ("{preset: qwen3-235b-eagle3, pp_size: 2}", "serve.preset: tp_size 2 x pp_size 2 (from preset "
                                                "qwen3-235b-eagle3) needs 4 nodes, the inventory has 3"),
])
def test_serving_nodes_that_cannot_be_are_refused(inv_file, serve, problem):
    ring = ("user: nvidia\nnodes: [{name: spark1, host: h1}, {name: spark2, host: h2}, {name: spark3, host: h3}]\n"
            "fabric: {topology: ring}\n")
    with pytest.raises(InventoryError) as refused:
        load_inventory(inv_file(ring + f"serve: {serve}\n"))
    assert any(problem in line for line in refused.value.problems), refused.value.problems
