"""Helpers of the lab tests of the engines whose ranks meet by themselves (vLLM, SGLang): their inventories, each
rank's container env against its node, the serving unit's state."""

from __future__ import annotations

import json
from dataclasses import replace

import yaml

from sparkctl.lab.image import image_ref
from sparkctl.plan.serve_unit import parse_show, show_command
from tests.lab.lab_kit import sh, sparkctl

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
