"""doctor with several worlds: each node's probe reads every world on it (its unit, log, /health and completion, at
the world's own names and address), the first world's under the sections' own names and the others' with their
suffix; the serving checks run on each world's view and their findings name the model; the rest runs once."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess

from sparkctl.doctor.bundle import bundle_files
from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.probes import parse_probe, probe_script, world_keys
from sparkctl.doctor.snapshot import ModelCache, NodeProbe, Snapshot, doctor_plan
from sparkctl.inventory import load_inventory
from sparkctl.transport.framing import Framing
from tests.unit.doctor_snapshot_kit import UNIT_RUNNING, bootstrapped
from tests.unit.inventory_kit import TWO_VLLM_WORLDS

#: the first world named `big` (findings name their model)
SEVERAL = TWO_VLLM_WORLDS.replace("Qwen3-8B, engine: vllm,", "Qwen3-8B, engine: vllm, name: big,")


def several(inv_file):
    inv = load_inventory(inv_file(SEVERAL))
    facts, plan = bootstrapped(inv)
    return inv, facts, plan


def test_each_world_s_sections_are_read_under_its_own_names(inv_file):
    inv, facts, plan = several(inv_file)
    nonce = Framing().nonce
    head = probe_script(inv, plan, facts["spark1"], "spark1", ["spark1", "spark2"], nonce=nonce)
    other = probe_script(inv, plan, facts["spark2"], "spark2", ["spark1", "spark2"], nonce=nonce)
    # the first world's on spark1 under the names one world always had, the gateway's beside them
    assert "systemctl show --timestamp=unix" in head and "sparkctl-serve-sparks.service" in head
    assert "sparkctl-serve-sparks--small.service" not in head and "sparkctl-gateway" in head
    # the second world's on spark2: its unit, its log, /health at its fabric address and engine port
    address = plan.launches["small"].host
    assert "sparkctl-serve-sparks--small.service" in other and "run/serve--small/serve.log" in other
    assert f"http://{address}:18357/health" in other and "_health__small=$(" in other
    assert f"http://{address}:18357/v1/chat/completions" in other and "sparkctl-gateway" not in other
    # the engine port of its own world is the one whose owner is read
    assert "sport = :18357" in other and "sport = :18355" not in other
    # a world is read on its own nodes only: a log another world left on a node is not taken for its own
    assert "run/serve--small/serve.log" not in head and "run/serve/serve.log" not in other
    framing = Framing(nonce)
    printed = {"health--small": "200", "unit--small": "ActiveState=failed\nLoadState=loaded"}
    script = "\n".join(framing.section(name, f"printf '%s\\n' {shlex.quote(text)}") for name, text in printed.items())
    stdout = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    probe = parse_probe(stdout, nonce, world_keys(inv))
    assert probe.health_status is None and probe.unit is None
    assert probe.worlds["small"].health_status == 200 and probe.worlds["small"].unit["ActiveState"] == "failed"


def healthy(inv, facts, plan) -> Snapshot:
    probes = {}
    for name, repo in (("spark1", "Qwen/Qwen3-8B"), ("spark2", "Qwen/Qwen3-4B")):
        facts[name].listening_tcp = {22: "sshd"}
        probes[name] = NodeProbe(hf_token_file=True, models=[ModelCache(repo, "complete")])
    first = dataclasses.replace(probes["spark1"], serve_log_exists=True, health_status=200, completion="The sea.",
                                unit=dict(UNIT_RUNNING), gateway="running",
                                gateway_ss="LISTEN 0 511 10.0.0.11:8355 0.0.0.0:*\n"
                                           "LISTEN 0 511 127.0.0.1:8355 0.0.0.0:*\n")
    second = dataclasses.replace(probes["spark2"], serve_log_exists=True, health_status=200, completion="Waves.",
                                 unit=dict(UNIT_RUNNING))
    probes["spark1"] = first
    probes["spark2"] = dataclasses.replace(probes["spark2"], worlds={"small": second})
    return Snapshot(inv, facts, {}, probes, plan)


def test_a_healthy_cluster_of_two_worlds_has_no_serving_finding(inv_file):
    snapshot = healthy(*several(inv_file))
    findings = run_checks(snapshot).findings
    found = [(f.id, f.node, f.summary) for f in findings if f.severity != "info"]
    assert not [f for f in found if f[0].startswith(("serve.", "model."))], found
    assert not [f for f in findings if f.id == "doctor.check_failed"], findings


def test_a_checkpoint_missing_on_a_world_s_node_is_an_error_once_any_world_served(inv_file):
    snapshot = healthy(*several(inv_file))
    snapshot.probes["spark2"] = dataclasses.replace(snapshot.probes["spark2"],
                                                    models=[ModelCache("Qwen/Qwen3-4B", "absent")])
    found = [(f.id, f.node, f.severity) for f in run_checks(snapshot).findings if f.id.startswith("model.")]
    assert found == [("model.absent", "spark2", "error")], found


def test_a_world_s_failed_unit_is_found_on_its_node_and_names_its_model(inv_file):
    snapshot = healthy(*several(inv_file))
    spark2 = snapshot.probes["spark2"]
    broken = dataclasses.replace(spark2.worlds["small"], health_status=0,
                                 unit={**UNIT_RUNNING, "ActiveState": "failed", "SubState": "failed",
                                       "Result": "exit-code"})
    snapshot.probes["spark2"] = dataclasses.replace(spark2, worlds={"small": broken})
    found = [(f.id, f.node, f.summary) for f in run_checks(snapshot).findings if f.id.startswith("serve.")]
    assert found and all(node == "spark2" and summary.startswith("small: ") for _id, node, summary in found), found
    assert ("serve.unit_failed", "spark2") in {(i, n) for i, n, _s in found}, found
    missing = dataclasses.replace(broken, unit={"LoadState": "not-found"})
    snapshot.probes["spark2"] = dataclasses.replace(spark2, worlds={"small": missing})
    (unit,) = [f for f in run_checks(snapshot).findings if f.id == "serve.unit_missing"]
    assert unit.summary == "small: the serving unit sparkctl-serve-sparks--small.service is not installed", unit
    assert unit.evidence.startswith("no /etc/systemd/system/sparkctl-serve-sparks--small.service")


def test_the_bundle_keeps_each_world_s_log_apart(inv_file):
    snapshot = healthy(*several(inv_file))
    spark2 = snapshot.probes["spark2"]
    logged = dataclasses.replace(spark2.worlds["small"], serve_log_tail="small's log", nccl_log="NCCL INFO small")
    snapshot.probes["spark2"] = dataclasses.replace(spark2, worlds={"small": logged})
    files = bundle_files(run_checks(snapshot), snapshot, [])
    assert files["spark2/serve--small.log"] == "small's log\n" and files["spark2/nccl--small.log"] == "NCCL INFO small"
    assert "small's log" not in files["spark2/probes.json"]


def test_the_plan_doctor_makes_has_every_world(inv_file):
    inv, facts, _plan = several(inv_file)
    plan, error = doctor_plan(inv, facts)
    assert error is None and set(plan.launches) == {"", "small"}


#: the pair as two TensorRT-LLM worlds: each has its figures collector on its head
TRTLLM_WORLDS = SEVERAL.replace('container: {image: "nvcr.io/nvidia/vllm:26.05-py3"}\n', "").replace(
    "engine: vllm", "engine: trtllm")


def test_each_tensorrt_llm_world_s_collector_is_read_on_its_head_and_found_down_by_its_model(inv_file):
    inv = load_inventory(inv_file(TRTLLM_WORLDS))
    facts, plan = bootstrapped(inv)
    nonce = Framing().nonce
    head = probe_script(inv, plan, facts["spark1"], "spark1", ["spark1", "spark2"], nonce=nonce)
    other = probe_script(inv, plan, facts["spark2"], "spark2", ["spark1", "spark2"], nonce=nonce)
    assert "sparkctl-collector 2>/dev/null" in head and "sparkctl-collector--small" not in head
    assert "sparkctl-collector--small 2>/dev/null" in other
    snapshot = healthy(inv, facts, plan)
    first, spark2 = snapshot.probes["spark1"], snapshot.probes["spark2"]
    snapshot.probes["spark1"] = dataclasses.replace(first, collector="running")
    snapshot.probes["spark2"] = dataclasses.replace(spark2, worlds={"small": dataclasses.replace(
        spark2.worlds["small"], collector="exited")})
    (found,) = [f for f in run_checks(snapshot).findings if f.id == "serve.collector_down"]
    assert (found.node, found.severity, found.summary) == ("spark2", "error",
                                                           "small: the figures collector is exited")
    assert found.evidence.startswith("container sparkctl-collector--small: exited")
