"""What every lab module does with a lab: run the real `sparkctl` and read its JSON events, run a shell line on a
node, and copy the lab's inventory with changes. One copy of each, imported by the modules (no test module imports
another)."""

from __future__ import annotations

import json
import os
import subprocess

import yaml

CONTAINER = "trtllm-multinode"
# a fake Hugging Face token: exported to the runs that serve, then searched for wherever it must never appear
HF_TOKEN = "hf_LabServeToken4f9c2a7d1e8b3c6a5f0d"


def events_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def sparkctl(args: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> tuple[int, list[dict], str]:
    """The installed `sparkctl ARGS` as a user runs it: (exit code, JSON events, stdout and stderr)."""
    proc = subprocess.run(["sparkctl", *args], capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else dict(os.environ))
    return proc.returncode, events_of(proc.stdout), proc.stdout + proc.stderr


def bootstrap(lab, *extra: str) -> tuple[int, list[dict]]:
    code, events, _ = sparkctl(["cluster", "bootstrap", str(lab.inventory_path), "--json", *extra])
    return code, events


def results(events: list[dict], *statuses: str) -> list[dict]:
    return [e for e in events if e.get("event") == "task_result" and e.get("status") in statuses]


def changed(events: list[dict]) -> set[tuple[str, str | None]]:
    """(task, node) of every changed outcome; node None for cluster-scope tasks."""
    return {(e["task"], e.get("node")) for e in results(events, "changed")}


def failures(events: list[dict]) -> list[dict]:
    return results(events, "failed")


def reboot(lab, node: str, *flags: str) -> None:
    """`sparkctl lab reboot` as a user runs it (`--hard`: a power cut)."""
    code, events, output = sparkctl(["lab", "reboot", "--dir", str(lab.dir), node, "--json", *flags])
    assert code == 0 and events[-1]["node"] == node, output


def sh(lab, node: str, command: str, check: bool = True) -> str:
    result = lab.exec(node, ["sh", "-c", command], timeout=60)
    assert not check or result.returncode == 0, result.stderr
    return result.stdout


def sh_output(lab, node: str, command: str) -> str:
    """What a shell line printed on the node, whatever its exit code."""
    return sh(lab, node, command, check=False)


def write_inventory(lab, path, serve: dict | None = None, nodes: int | None = None, image: str | None = None) -> str:
    """The lab's inventory with a serve section (and only its first `nodes` nodes, another container image),
    written to PATH."""
    document = yaml.safe_load(lab.inventory_path.read_text())
    if image is not None:
        document.setdefault("container", {})["image"] = image
    if nodes is not None:
        document["nodes"] = document["nodes"][:nodes]
        document["fabric"]["topology"] = "single"
    if serve is not None:
        document["serve"] = serve
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)
