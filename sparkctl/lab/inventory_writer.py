"""What `sparkctl lab up` hands to the product: a plain-data inventory, the controller key, known_hosts.

The lab never imports the product's inventory model: it writes the documented schema as plain YAML.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from sparkctl.lab.naming import NODE_USER

KEY_NAME = "id_ed25519"
def write_controller_key(directory: Path) -> Path:
    """A fresh ed25519 key for the controller (the machine), authorized for nvidia on every node."""
    key = directory / KEY_NAME
    for stale in (key, key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkctl-lab-controller",
                    "-f", str(key)], check=True, capture_output=True, timeout=30)
    return key


def known_hosts_lines(host: str, host_key_dir: Path) -> list[str]:
    """`<ip> <type> <key>` for each of a node's real host keys."""
    lines = []
    for pub in sorted(host_key_dir.glob("ssh_host_*_key.pub")):
        keytype, key = pub.read_text().split()[:2]
        lines.append(f"{host} {keytype} {key}")
    return lines


def write_known_hosts(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o644)


def inventory_document(directory: Path, cluster_name: str, nodes: list[tuple[str, str]], topology: str,
                       port: int, image: str) -> dict:
    return {
        "cluster": {"name": cluster_name},
        "user": NODE_USER,
        "ssh": {
            "identity_file": str(directory / KEY_NAME),
            "known_hosts": str(directory / "known_hosts"),
            "use_ssh_config": False,
            "port": 22,
        },
        "nodes": [{"name": name, "host": host} for name, host in nodes],
        # a ring cables both ports: fabric.port would say otherwise
        "fabric": {"topology": topology} if topology == "ring" else {"topology": topology, "port": port},
        "container": {"image": image},
    }


def write_inventory(path: Path, document: dict) -> None:
    header = "# Written by `sparkctl lab up`: a lab of simulated DGX Sparks on this machine.\n"
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False))


def write_secret(path: Path, value: str) -> None:
    """0600 from the first byte: never world-readable, even for a moment."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    path.chmod(0o600)


def add_serve_section(path: Path, preset: str, engine: str = "trtllm") -> None:
    """Serve PRESET from the lab: the nodes have this machine's memory, far less than a Spark's, so the fit
    check warns instead of refusing; the gated fixture repos take any token. A preset of another engine than
    TensorRT-LLM runs that engine's default image, which the lab's image is also named (lab/image.py)."""
    document = yaml.safe_load(path.read_text())
    document["serve"] = {"preset": preset, "fit_check": "warn", "ready_timeout": 300}
    if engine != "trtllm":
        document.get("container", {}).pop("image", None)
        if not document.get("container"):
            document.pop("container", None)
    write_inventory(path, document)
