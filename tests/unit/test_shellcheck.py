"""Every script sparkctl renders from templates/ to run on a node, as the planners render it for each engine and
topology of inventories/, read by shellcheck (Debian's package, which the test command installs) for the shell its
shebang names. What shellcheck finds is fixed in the template; a finding that is the point (an expansion meant for
the peer's shell) is said so by a directive on that line, with the reason beside it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.inventory import load_inventory
from sparkctl.plan import plan_cluster
from sparkctl.runs import lock
from sparkctl.tasks.model.streams import streams_script
from sparkctl.tasks.network.firewall_guard import guard_script
from tests.taskkit import REPO

INVENTORIES = sorted((REPO / "inventories").glob("*.yaml"))
STATE = "/home/nvidia/.local/state/sparkctl/cluster"


def rendered_scripts() -> dict[str, str]:
    """name -> text of every node-side script the plans of the example inventories render."""
    out = {}
    for path in INVENTORIES:
        inventory = load_inventory(str(path))
        plan = plan_cluster(inventory)
        if plan.entrypoint:
            out[f"{path.stem}: container entrypoint"] = plan.entrypoint
        for node in plan.launch.commands():
            unit = plan.launch.unit(inventory, node, state_dir=STATE, user="nvidia", fingerprint="f")
            out[f"{path.stem}: {node}'s unit.sh"] = unit.host_text()
            out[f"{path.stem}: {node}'s world.sh"] = unit.world_text()
    routes = [("192.168.100.11", ""), ("192.168.101.11", "")]
    out["copy streams"] = streams_script("/src", "/dst", routes, [["blobs/a"], ["b"], ["c"]], "/tmp/l",
                                         repo="org/m", peer="spark2", allow=["192.168.100.10"])
    out["copy streams off the fabric"] = streams_script("/src", "/dst", [("10.0.0.12", "-p 22 -i ~/.ssh/k")],
                                                        [["b"]], "/tmp/l", repo="org/m", peer="spark2")
    out["firewall revert guard"] = guard_script("1795970183756", 60)
    out["cluster lock: holder"] = lock.hold_script()
    out["cluster lock: takeover"] = lock.takeover_script()
    out["cluster lock: peek"] = lock.peek_script()
    return out


SCRIPTS = rendered_scripts()


def test_every_engine_and_topology_renders_its_scripts():
    names = " ".join(SCRIPTS)
    for engine in ("two-sparks", "two-sparks-vllm", "two-sparks-sglang", "four-sparks-ring"):
        assert f"{engine}: spark1's world.sh" in names, names


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is installed by scripts/test")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_shellcheck_finds_nothing(name: str, tmp_path: Path):
    script = tmp_path / "script"
    script.write_text(SCRIPTS[name])
    assert SCRIPTS[name].startswith(("#!/bin/bash\n", "#!/bin/sh\n")), "a shebang names the shell it runs under"
    result = subprocess.run(["shellcheck", "--severity=info", "--format=gcc", str(script)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"{name}:\n{result.stdout}"
