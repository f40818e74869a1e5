"""The figures collector's part of serve.gateway (sparkctl/plan/collector.py): read in the gateway's one read of the
head, changed in its apply, so a no-op asks the head nothing more. The collector is what the gateway's /metrics
fronts; a cluster whose engine keeps its own counters has none, and one left from another engine is removed.

Idempotent: the script on the head has the shipped content (its sha256), the container runs from the planned spec
(image, argv, the script's hash, restart policy) and is running.
"""

from __future__ import annotations

import hashlib
import shlex

from sparkctl.plan.collector import COLLECTOR_CONTAINER, CollectorSpec, collector_script
from sparkctl.plan.container import CLUSTER_LABEL, SPEC_LABEL
from sparkctl.taskgraph.task import Change
from sparkctl.tasks.container.run import remove_command
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.serve.gateway_actions import GatewayAction
from sparkctl.transport.base import q
from sparkctl.transport.framing import Framing


def collector_sections(spec: CollectorSpec | None, framing: Framing) -> list[str]:
    """What the gateway's read of the head adds: the script's sha256 and the container's state (or whether one of
    this cluster's is there at all, when none is planned)."""
    inspect = ("docker inspect -f '{{.State.Running}} {{index .Config.Labels \"" + SPEC_LABEL + "\"}} "
               "{{index .Config.Labels \"" + CLUSTER_LABEL + "\"}} {{.HostConfig.RestartPolicy.Name}}' "
               + COLLECTOR_CONTAINER + " 2>/dev/null")
    script = f"sha256sum {q(spec.script_path)} 2>/dev/null | cut -d' ' -f1" if spec else "true"
    return [framing.section("collector-script", script), framing.section("collector", inspect)]


def collector_changes(spec: CollectorSpec | None, cluster: str, texts: dict[str, str],
                      head: str) -> list[Change[GatewayAction]]:
    inspected = texts.get("collector", "").split()
    running = inspected[:1] == ["true"]
    label, owner, policy = (inspected + ["", "", "", ""])[1:4]
    if spec is None:
        if inspected and owner == cluster:
            return [Change(f"remove the figures collector {COLLECTOR_CONTAINER} on {head} (the engine keeps its own "
                           "counters)", node=head, payload="collector-remove")]
        return []
    changes: list[Change[GatewayAction]] = []
    if texts.get("collector-script", "").strip() != hashlib.sha256(collector_script().encode()).hexdigest():
        changes.append(Change(f"write the figures collector's script on {head} ({spec.script_path})", node=head,
                              payload="collector-script"))
    if not inspected or label != spec.spec_hash() or policy != "unless-stopped":
        why = "absent" if not inspected else "made from another spec"
        changes.append(Change(f"run the figures collector {COLLECTOR_CONTAINER} on {head} ({why}): the one reader "
                              f"of the engine's /metrics, on 127.0.0.1:{spec.port}", node=head,
                              payload="collector-create"))
    elif not running:
        changes.append(Change(f"start the figures collector {COLLECTOR_CONTAINER} on {head}", node=head,
                              payload="collector-start"))
    return changes


def apply_collector(head: NodeContext, spec: CollectorSpec | None, actions: set[str | None]) -> None:
    if "collector-remove" in actions:
        head.must(remove_command(COLLECTOR_CONTAINER), f"removing {COLLECTOR_CONTAINER}", timeout=120)
    if spec is None:
        return
    if "collector-script" in actions or "collector-create" in actions:
        head.must(f"install -d -m 755 {q(spec.script_dir)}", f"making {spec.script_dir}")
        head.transport.put(spec.script_path, collector_script(), mode=0o644)
    if "collector-create" in actions:
        head.run(f"{remove_command(COLLECTOR_CONTAINER)} >/dev/null 2>&1; true", timeout=120)
        head.must(shlex.join(spec.run_argv()), f"docker run {COLLECTOR_CONTAINER}", timeout=300)
    elif "collector-start" in actions:
        head.must(f"docker start {COLLECTOR_CONTAINER}", f"docker start {COLLECTOR_CONTAINER}", timeout=60)
