"""The vLLM plan: each serving node's container settings from its own twins, its `vllm serve` line per the image's
release (mp with --nnodes, or Ray where the release has no --nnodes), and the --config file."""

from __future__ import annotations

import shlex

import pytest

from sparkctl.knowledge.vllm_releases import VllmVersion
from sparkctl.plan import plan_cluster
from sparkctl.plan.vllm import VLLM_CONFIG_PATH, VllmLaunch, VllmPlanError, vllm_launch
from tests.taskkit import REPO, inventory_from_yaml, spark_facts

EXAMPLE = (REPO / "inventories" / "two-sparks-vllm.yaml").read_text()


def facts():
    """The pair with port 1 cabled, addressed as planned (.10 the head, .11 the peer)."""
    return {"spark1": spark_facts("spark1", addresses={"enp1s0f1np1": ["192.168.100.10/24"],
                                                       "enP2p1s0f1np1": ["192.168.101.10/24"]}),
            "spark2": spark_facts("spark2", session_ip="10.0.0.12",
                                  addresses={"enp1s0f1np1": ["192.168.100.11/24"],
                                             "enP2p1s0f1np1": ["192.168.101.11/24"]})}


def test_each_container_has_its_own_nodes_settings_as_the_playbook_names_them(tmp_path):
    plan = plan_cluster(inventory_from_yaml(EXAMPLE, tmp_path), facts())
    for node, ip in (("spark1", "192.168.100.10"), ("spark2", "192.168.100.11")):
        env = plan.nodes[node].container.env
        # NVIDIA/dgx-spark-playbooks nvidia/vllm/README.md, Run on two Sparks, steps 4-5: these names, each node's own
        assert env["VLLM_HOST_IP"] == ip
        assert env["NCCL_SOCKET_IFNAME"] == env["UCX_NET_DEVICES"] == env["OMPI_MCA_btl_tcp_if_include"] == \
            "enp1s0f1np1,enP2p1s0f1np1"
        assert env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert env["RAY_memory_monitor_refresh_ms"] == "0"
        assert not any(k.startswith("SPARKCTL_") or k == "OMPI_MCA_orte_default_hostfile" for k in env)
        argv = plan.nodes[node].container.run_argv()
        assert argv[-3:] == ["nvcr.io/nvidia/vllm:26.05-py3", "sleep", "infinity"]  # no sshd, no mesh
        assert not any("/tmp/.ssh" in a for a in argv)


def test_on_a_release_with_nnodes_every_node_runs_its_own_vllm_serve(tmp_path):
    plan = plan_cluster(inventory_from_yaml(EXAMPLE, tmp_path), facts())
    launch = plan.launch
    assert isinstance(launch, VllmLaunch) and launch.executor == "mp" and not launch.ray
    head, peer = launch.serve["spark1"], launch.serve["spark2"]
    common = ["vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct", "--config", VLLM_CONFIG_PATH,
              "--tensor-parallel-size", "2", "--nnodes", "2"]
    assert head[:len(common)] == common and peer[:len(common)] == common
    assert shlex.join(head[len(common):]) == ("--node-rank 0 --master-addr 192.168.100.10 --master-port 29501 "
                                              "--served-model-name meta-llama/Llama-3.3-70B-Instruct "
                                              "--host 127.0.0.1 --port 18000")
    assert shlex.join(peer[len(common):]) == "--node-rank 1 --master-addr 192.168.100.10 --master-port 29501 --headless"
    assert plan.launch.head_command() == shlex.join(head)
    assert launch.config == {"max-model-len": 2048, "speculative-config": {
        "method": "eagle3", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2,
        "model": "/root/.cache/huggingface/sparkctl-models/yuhuili--EAGLE3-LLaMA3.3-Instruct-70B"}}
    assert plan.launch.config_text() == launch.config_text() and plan.hostfile == "" and plan.entrypoint == ""


def test_a_release_without_nnodes_meets_over_ray_one_node_each(tmp_path):
    text = EXAMPLE.replace("nvcr.io/nvidia/vllm:26.05-py3", "nvcr.io/nvidia/vllm:25.10-py3")
    launch = vllm_launch(inventory_from_yaml(text, tmp_path), plan_cluster(
        inventory_from_yaml(text, tmp_path), facts()).fabric)
    assert launch.executor == "ray" and "0.10.2 has no --nnodes" in launch.why
    assert launch.ray == {
        "spark1": ["ray", "start", "--head", "--port", "6379", "--node-ip-address", "192.168.100.10", "--num-gpus",
                   "1", "--block"],
        "spark2": ["ray", "start", "--address", "192.168.100.10:6379", "--node-ip-address", "192.168.100.11",
                   "--num-gpus", "1", "--block"]}
    assert list(launch.serve) == ["spark1"]
    assert "--distributed-executor-backend" in launch.serve["spark1"] and "--headless" not in launch.serve["spark1"]
    # the loader refuses mp on such an image's tag; a running image whose release is older than its tag still is
    forced = inventory_from_yaml(EXAMPLE.replace("executor: auto", "executor: mp"), tmp_path)
    with pytest.raises(VllmPlanError, match="vLLM 0.10.2 has no --nnodes"):
        vllm_launch(forced, plan_cluster(forced, facts()).fabric, VllmVersion(0, 10, 2))
