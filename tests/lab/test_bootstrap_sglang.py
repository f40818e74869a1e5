"""SGLang across the lab's Sparks, on a pair and on a ring of three that serves on two: bootstrap ends with the
endpoint answering behind the gateway; each rank's container says its own node's fabric (SGLANG_HOST_IP, Gloo's
interface) and prints NCCL lines for its own twins; what SGLang does not need is skipped with its reason; a rerun
changes nothing; a worker whose SGLANG_HOST_IP was changed by hand is found by doctor and repaired by bootstrap;
`top` reads SGLang's own metrics during a bench; switching one inventory trtllm -> vllm -> sglang -> trtllm by
bootstrap alone converges each time.

The lab image carries the `sglang` stand-in (`python3 -m sglang.launch_server`: it parses the release's flags with
argparse and meets over the fabric at --dist-init-addr) and is also named nvcr.io/nvidia/sglang:26.02-py3, the
product's default SGLang image.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest
import yaml

from tests.lab import ranks_kit
from tests.lab.lab_kit import HF_TOKEN, changed, failures, sh, sparkctl
from tests.lab.ranks_kit import (
    engine_inventory,
    fabric_address,
    run,
    seed_a_worker_s_address,
    trtllm_inventory,
    unit_state,
)
from tests.lab.serve_kit import SGLANG_SEEDS

pytestmark = pytest.mark.lab

SGLANG_CONTAINER = "sglang-multinode"
SERVE = {"preset": "llama-3.3-70b-sglang-eagle3", "fit_check": "warn", "ready_timeout": 300}
VLLM_SERVE = {"preset": "llama-3.3-70b-vllm", "fit_check": "warn", "ready_timeout": 300}
SKIPPED = {"container.ssh", "mpi.hostfile"}


def container_env(lab, node: str) -> dict[str, str]:
    return ranks_kit.container_env(lab, node, SGLANG_CONTAINER)


@pytest.fixture(scope="module", params=["pair", "ring3"])
def served(request, lab_factory, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1) if request.param == "pair" else lab_factory(3, "ring")
    env = {**os.environ, "HF_TOKEN": HF_TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("sglang-state"))}
    inventory = engine_inventory(lab, tmp_path_factory.mktemp("inv") / "sglang.yaml", SERVE)
    code, events, output = sparkctl(["cluster", "bootstrap", inventory, "--json"], env)
    assert code == 0, output[-3000:]
    cluster = yaml.safe_load(lab.inventory_path.read_text())["cluster"]["name"]
    yield {"lab": lab, "env": env, "inventory": inventory, "events": events, "cluster": cluster,
           "serving": ["spark1", "spark2"], "nodes": [n.name for n in lab.nodes]}
    lab.down()


def test_bootstrap_serves_with_a_rank_per_node_each_on_its_own_fabric(served):
    lab, events, env = served["lab"], served["events"], served["env"]
    assert ("serve.launch", None) in changed(events)
    skipped = {e["task"]: e.get("message", "") for e in events
               if e["event"] == "task_result" and e["status"] == "skipped"}
    assert set(skipped) >= SKIPPED and all("SGLang" in skipped[t] for t in SKIPPED), skipped
    chat = sparkctl(["serve", "chat", served["inventory"], "hello"], env)
    assert chat[0] == 0 and chat[2].strip(), chat[2]
    for rank, node in enumerate(served["serving"]):
        have = container_env(lab, node)
        own = have["GLOO_SOCKET_IFNAME"]
        assert have["SGLANG_HOST_IP"] == fabric_address(lab, node, own)
        assert own in have["NCCL_SOCKET_IFNAME"].split(",")
        assert unit_state(lab, node, served["cluster"])["ActiveState"] == "active"
        args = sh(lab, node, f"docker exec {SGLANG_CONTAINER} ps -eo args").splitlines()
        ranks = [x for x in args if x.startswith("python3 -m sglang.launch_server")]
        assert len(ranks) == 1 and f"--node-rank {rank}" in ranks[0], args
        assert "--dist-init-addr" in ranks[0] and "--enable-metrics" in ranks[0]
    # each serving node's NCCL lines were read by verify.fabric, and no node but the serving ones has a unit
    verify = [e["node"] for e in events if e["event"] == "log" and e.get("task") == "verify.fabric"
              and "used network" in e.get("message", "")]
    assert sorted(verify) == served["serving"], verify
    for node in set(served["nodes"]) - set(served["serving"]):
        assert unit_state(lab, node, served["cluster"])["LoadState"] == "not-found"


def test_a_rerun_changes_nothing(served):
    events = run(served["inventory"], served["env"], "cluster", "bootstrap")
    assert changed(events) == set(), changed(events)


@pytest.mark.parametrize("finding", sorted(SGLANG_SEEDS))
def test_a_worker_whose_sglang_host_ip_was_changed_is_found_by_doctor_and_repaired_by_bootstrap(served, finding):
    """On the ring: the worker's management address (its scheduler advertises the management network); on the
    pair: the head's fabric address (the ranks advertise one address). Doctor names it with its evidence; bootstrap
    recreates the container and restarts the world; the next run changes nothing."""
    where, _what = SGLANG_SEEDS[finding]
    if served["lab"].state.topology != ("pair" if where == "pair" else "ring"):
        pytest.skip(f"seeded on the {where}")
    seed_a_worker_s_address(served, finding, container=SGLANG_CONTAINER, setting="SGLANG_HOST_IP",
                            wrong_nic="sglang.wrong_address")


def test_top_reads_sglang_s_own_figures_during_a_bench(served, tmp_path):
    if served["lab"].state.topology != "pair":
        pytest.skip("proven on the pair")
    env, inventory = served["env"], served["inventory"]
    bench = subprocess.Popen(["sparkctl", "serve", "bench", inventory, "--requests", "5000", "--concurrency", "4",
                              "--max-tokens", "384", "-o", str(tmp_path / "bench.json")], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2)  # under way
        code, events, output = sparkctl(["top", inventory, "--once", "--json", "--interval", "2"], env)
    finally:
        bench.terminate()  # it only has to outlast the reading
        bench.wait(timeout=60)
    assert code == 0, output[-2000:]
    (frame,) = [e for e in events if e["event"] == "top"]
    assert frame["serving"]["engine"] == "sglang" and frame["serving"]["generation_tps"] > 0, frame["serving"]
    assert frame["serving"]["running"] is not None and frame["serving"]["kv_cache_fraction"] is not None


def test_switching_one_inventory_between_the_three_engines_converges_each_time(served, tmp_path):
    """trtllm -> vllm -> sglang -> trtllm, by bootstrap alone: each switch retires the last engine's containers and
    units where the next has none, and the run after it changes nothing."""
    if served["lab"].state.topology != "pair":
        pytest.skip("the switch is proven on the pair")
    lab, env = served["lab"], served["env"]
    trtllm = trtllm_inventory(lab, tmp_path / "trtllm.yaml")
    vllm = engine_inventory(lab, tmp_path / "vllm.yaml", VLLM_SERVE)
    names = {trtllm: "trtllm-multinode", vllm: "vllm-multinode", served["inventory"]: SGLANG_CONTAINER}
    for inventory in (trtllm, vllm, served["inventory"], trtllm, served["inventory"]):
        events = run(inventory, env, "cluster", "bootstrap")
        assert {("container.retire", n) for n in served["nodes"]} <= changed(events), failures(events)
        for node in served["nodes"]:
            present = set(sh(lab, node, "docker ps -a --format '{{.Names}}'").split())
            assert names[inventory] in present and not present & (set(names.values()) - {names[inventory]}), present
        chat = sparkctl(["serve", "chat", inventory, "hello"], env)
        assert chat[0] == 0 and chat[2].strip(), (inventory, chat[2])
        assert changed(run(inventory, env, "cluster", "bootstrap")) == set()
