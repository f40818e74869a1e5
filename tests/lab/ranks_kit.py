"""Helpers of the lab tests of the engines whose ranks meet by themselves (vLLM, SGLang): their inventories, each
rank's container env against its node, the serving unit's state."""

from __future__ import annotations

import json
from dataclasses import replace

import yaml

from sparkctl.lab.image import image_ref
from sparkctl.plan.serve_unit import parse_show, show_command
from tests.lab.doctor_kit import doctor, errors, replace_container
from tests.lab.lab_kit import changed, sh, sparkctl

TRTLLM_SERVE = {"preset": "qwen3-235b-eagle3", "fit_check": "warn"}


def engine_inventory(lab, path, serve: dict, image: str | None = None) -> str:
    """The lab's inventory serving `serve` with NCCL's INFO lines on: the engine's default container and image, or
    `image`."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["serve"] = dict(serve)
    document["container"] = {"env": {"NCCL_DEBUG": "INFO"}, **({"image": image} if image else {})}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def trtllm_inventory(lab, path) -> str:
    return engine_inventory(lab, path, TRTLLM_SERVE, image=image_ref())


def run(inventory: str, env: dict[str, str], *args: str) -> list[dict]:
    code, events, output = sparkctl([*args, inventory, "--json"], env)
    assert code == 0, output[-3000:]
    return events


def container_env(lab, node: str, container: str) -> dict[str, str]:
    pairs = json.loads(sh(lab, node, f"docker inspect --format '{{{{json .Config.Env}}}}' {container}"))
    return dict(p.split("=", 1) for p in pairs)


def fabric_address(lab, node: str, iface: str) -> str:
    return sh(lab, node, f"ip -4 -o addr show dev {iface}").split()[3].split("/")[0]


def unit_state(lab, node: str, cluster: str) -> dict[str, str]:
    return parse_show(sh(lab, node, show_command(cluster)))


def with_env(spec, **values):
    return replace(spec, env={**spec.env, **values})


def seed_a_worker_s_address(served, finding: str, *, container: str, setting: str, wrong_nic: str) -> None:
    """The worker's `setting` (its rank's advertised address) changed by hand: to its management address for the
    finding `wrong_nic` (a rank on the wrong NIC), else to the head's own (two ranks with one address). Doctor names
    it on the worker with the address in its evidence; bootstrap recreates the container and restarts the world;
    the next run changes nothing and doctor is clean."""
    lab, env, inventory = served["lab"], served["env"], served["inventory"]
    document = yaml.safe_load(lab.inventory_path.read_text())
    wrong = document["nodes"][1]["host"] if finding == wrong_nic else container_env(lab, "spark1", container)[setting]
    replace_container(lab, "spark2", lambda spec: with_env(spec, **{setting: wrong}), inventory=inventory,
                      serves=False, container=container)
    report = doctor(lab, inventory=inventory, env=env)
    assert (finding, "spark2") in errors(report), report["findings"]
    found = next(f for f in report["findings"] if f["id"] == finding)
    assert wrong in found["evidence"], found
    events = run(inventory, env, "cluster", "bootstrap")
    assert {("container.run", "spark2"), ("serve.launch", None)} <= changed(events), changed(events)
    assert container_env(lab, "spark2", container)[setting] != wrong
    assert changed(run(inventory, env, "cluster", "bootstrap")) == set()
    assert not errors(doctor(lab, inventory=inventory, env=env))
