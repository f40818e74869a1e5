"""PURE checks of settings that silently override sparkctl's: NCCL/UCX/Open MPI variables in the image's env, in
the container's /etc/nccl.conf, ~/.nccl.conf, ~/.bashrc or /etc/environment, in the node user's shell startup
files, and sshd drop-ins (/etc/ssh/sshd_config.d) that break the node-to-node ssh mesh."""

from __future__ import annotations

from sparkctl.doctor.catalog import ENV_FILE_SETTING, ENV_HOST_SETTING, ENV_IMAGE_SETTING, SSH_SSHD_DROPIN
from sparkctl.doctor.findings import Finding, Severity, finding
from sparkctl.doctor.node_probes import OVERRIDE_PREFIXES, Setting
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.cuda import off_the_fabric
from sparkctl.rules.sshd import sshd_problem


def _planned_env(s: Snapshot, node: str) -> dict[str, str]:
    if s.plan is None or node not in s.plan.nodes:
        return {}
    return dict(s.plan.nodes[node].container.env)


def _judge(name: str, value: str, planned: dict[str, str]) -> tuple[Severity, str] | None:
    """(severity, why) of a setting found outside sparkctl's own, or None when it changes nothing."""
    if planned.get(name) == value:
        return None
    breaking = off_the_fabric(name, value)
    if breaking:
        return "error", breaking
    if name in planned:
        return "error", f"sparkctl sets {name}={planned[name]}"
    return "warning", "sparkctl does not set it: NCCL/UCX/Open MPI take it as it is"


def check_container_settings(s: Snapshot) -> list[Finding]:
    out = []
    name = s.inventory.container.name
    for node in s.order:
        planned = _planned_env(s, node)
        info = s.facts[node].containers.get(name)
        if info is not None and info.exists:
            for key, value in sorted(info.env.items()):
                if key.startswith(OVERRIDE_PREFIXES) and key not in planned:
                    judged = _judge(key, value, planned)
                    if judged:
                        out.append(finding(ENV_IMAGE_SETTING, node,
                                           f"the image sets {key}, which sparkctl does not", evidence=(
                                               f"{key}={value} in {name}'s env (from the image "
                                               f"{info.image or s.inventory.container.image}): {judged[1]}"),
                                           fix=f"add {key} to container.env in the inventory with the value you "
                                               "want (sparkctl's -e wins over the image), then sparkctl cluster "
                                               "bootstrap", severity=judged[0]))
        for setting in s.probe(node).system.container_settings:
            if setting.path.endswith("nccl.conf") and setting.name in planned:
                continue  # the environment wins over nccl.conf (NCCL docs): sparkctl's value holds
            judged = _judge(setting.name, setting.value, planned)
            if judged:
                summary, evidence, fix = _file_words(judged, setting, f"inside {name}")
                out.append(finding(ENV_FILE_SETTING, node, summary, evidence=evidence, fix=fix, severity=judged[0]))
    return out


def _file_words(judged: tuple[str, str], setting: Setting, where: str) -> tuple[str, str, str]:
    """(summary, evidence, fix) of a finding about a setting in a file."""
    return (f"{setting.path} {where} sets {setting.name}", f"{setting} ({judged[1]})",
            f"remove line {setting.line} of {setting.path} {where} (a person must: sparkctl does not edit files it "
            "did not write)")


def check_host_settings(s: Snapshot) -> list[Finding]:
    """A node's own startup files do not reach sparkctl's containers, but every NCCL/UCX program a person runs on
    the node (nccl-tests, a manual launch) takes them instead of the fabric settings."""
    out = []
    for node in s.order:
        planned = _planned_env(s, node)
        for setting in s.probe(node).system.host_settings:
            judged = _judge(setting.name, setting.value, planned)
            if judged:
                summary, evidence, fix = _file_words(
                    judged, setting, "on the node (not in the container: it steers what you run by hand)")
                out.append(finding(ENV_HOST_SETTING, node, summary, evidence=evidence, fix=fix))
    return out


def check_sshd_dropins(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        f = s.facts[node]
        user, seen = s.user_of(node), set()
        for path, key, value in s.probe(node).system.sshd_dropins:
            if key in seen:
                continue  # sshd takes the first value it reads
            seen.add(key)
            problem = sshd_problem(key, value, user, f.groups, len(s.inventory.nodes))
            if problem:
                out.append(finding(SSH_SSHD_DROPIN, node, f"{path} breaks the node-to-node ssh mesh",
                                   evidence=f"{key} {value} in {path}: {problem} (sshd applies it at its next start)",
                                   fix=f"remove or change that line of {path}, then sudo systemctl reload ssh (a "
                                       "person must: sparkctl does not edit sshd's own configuration)"))
    return out


CHECKS = [check_container_settings, check_host_settings, check_sshd_dropins]
