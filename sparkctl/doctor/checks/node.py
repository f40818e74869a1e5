"""PURE node checks: reachability, user, sudo, docker, clocks, memory, disk, the image release."""

from __future__ import annotations

import shlex

from sparkctl.doctor.catalog import (
    DISK_HF_CACHE_LOW,
    DOCTOR_RUN_IN_PROGRESS,
    IMAGE_KNOWN_BAD_RELEASE,
    NODE_CLOCK_SKEW,
    NODE_CMA_RESERVED,
    NODE_DOCKER_BROKEN,
    NODE_DOCKER_GROUP,
    NODE_DOCKER_MISSING,
    NODE_FACTS_PARTIAL,
    NODE_HOST_KEY_CHANGED,
    NODE_LOW_MEMORY,
    NODE_NOT_SPARK,
    NODE_NOT_SSH,
    NODE_PAGE_CACHE,
    NODE_SSH_AUTH,
    NODE_SSH_REFUSED,
    NODE_SUDO_PASSWORD,
    NODE_SWAP_IN_USE,
    NODE_UNREACHABLE,
    NODE_USER_MISMATCH,
)
from sparkctl.doctor.findings import CLUSTER, Finding, Severity, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.inventory import ServeSpec
from sparkctl.inventory.placement import node_loads
from sparkctl.knowledge.fitcheck import needed_per_node_gb
from sparkctl.knowledge.trtllm_releases import KNOWN_BAD_RELEASES
from sparkctl.rules.clock import MAX_SKEW_S, clock_skew
from sparkctl.rules.serving import serves, serving_enabled

LOW_MEMORY_FRACTION = 0.10
PAGE_CACHE_FRACTION = 0.25
HF_CACHE_MIN_FREE_GB = 20.0
DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"
#: Swap in use above this is reported (a few MB are paged out on any long-running machine).
SWAP_USED_BYTES = 1 << 30



def _gb(value_bytes: float) -> str:
    return f"{value_bytes / 1e9:.1f} GB"


def check_reachability(s: Snapshot) -> list[Finding]:
    out = []
    for node, reason in s.unreachable.items():
        target = s.inventory.ssh_target(node)
        # the fix lines are commands to paste: the inventory's values in them are quoted like in every command
        login, host = shlex.quote(f"{target.user}@{target.host}"), shlex.quote(target.host)
        kind = s.unreachable_kinds.get(node) or ("auth" if "authentication failed" in reason else
                                                 "host_key" if "host key CHANGED" in reason else "network")
        if kind == "auth":
            out.append(finding(NODE_SSH_AUTH, node, "SSH login is refused (authentication failed)",
                               evidence=f"{reason}; logging in as {target.user} to {target.host}",
                               fix=f"ssh-copy-id -p {target.port} {login} (or set "
                                   "ssh.identity_file in the inventory to the key the node accepts)"))
        elif kind == "host_key":
            out.append(finding(NODE_HOST_KEY_CHANGED, node, "the node's SSH host key changed",
                               evidence=reason.split(";")[0],
                               fix="if the node was reinstalled: the ssh-keygen -R line in the evidence, then rerun"))
        elif "accepted and closed the connection" in reason or "not as an SSH server" in reason:
            out.append(finding(NODE_NOT_SSH, node, f"port {target.port} on the node does not speak SSH",
                               evidence=reason,
                               fix=f"check that sshd listens on {target.host} port {target.port} (and nothing in "
                                   f"front of it closes connections): ssh -p {target.port} {login}"))
        elif "connection refused" in reason:
            out.append(finding(NODE_SSH_REFUSED, node, f"nothing listens on port {target.port}",
                               evidence=reason,
                               fix=f"start sshd on the node (sudo systemctl start ssh), or set the node's port in "
                                   f"the inventory: ssh -p {target.port} {login}"))
        else:
            out.append(finding(NODE_UNREACHABLE, node, "the node cannot be reached over SSH",
                               evidence=reason,
                               fix=f"check that {target.host} is powered on and on the network "
                                   f"(ping {host}; ssh -p {target.port} {login})"))
    return out


def check_busy(s: Snapshot) -> list[Finding]:
    if not s.busy:
        return []
    return [finding(DOCTOR_RUN_IN_PROGRESS, CLUSTER, "another run is changing the cluster now",
                    evidence=f"{s.busy} holds the cluster lock; what doctor saw may be mid-change",
                    fix="wait for that run to end, then run doctor again")]


def check_access(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        f = s.facts[node]
        want = s.user_of(node)
        if f.user and f.user != want:
            out.append(finding(NODE_USER_MISMATCH, node, "logged in as another user than the inventory's",
                               evidence=f"user {f.user!r}, the inventory says {want!r}",
                               fix=f"use the same account on every node: set user: {f.user} in the inventory, or "
                                   f"create {want} on {node}"))
        if not f.sudo_nopasswd and not s.become_password_given:
            out.append(finding(NODE_SUDO_PASSWORD, node, "sudo asks for a password that was not given",
                               evidence=f"`sudo -n true` fails for {f.user}",
                               fix=f"rerun with --ask-become-pass, or allow passwordless sudo: "
                                   f"echo '{f.user} ALL=(ALL) NOPASSWD: ALL' | sudo tee /etc/sudoers.d/{f.user}"))
        if not f.docker_cli:
            out.append(finding(NODE_DOCKER_MISSING, node, "docker is not installed",
                               evidence="`command -v docker` finds nothing",
                               fix="install docker and the NVIDIA container runtime (DGX OS ships both)"))
        elif not f.docker_access and f.docker_denied:
            out.append(finding(NODE_DOCKER_GROUP, node, f"{f.user} cannot use docker",
                               evidence=f"{f.docker_error}; groups: {' '.join(f.groups)}",
                               fix=f"sudo usermod -aG docker {shlex.quote(f.user)} (then log in again: sessions "
                                   "keep old groups)"))
        elif not f.docker_access:
            out.append(finding(NODE_DOCKER_BROKEN, node, f"docker does not work for {f.user}",
                               evidence=f.docker_error or "`docker ps` gives no answer",
                               fix=f"see `docker info` on {node} (the daemon, its storage or the runtime; not a "
                                   "permission)"))
        if f.os_id and not f.is_dgx_spark:
            out.append(finding(NODE_NOT_SPARK, node, "not recognised as a DGX Spark",
                               evidence=f"/etc/dgx-release: {f.dgx_name or 'absent'}",
                               fix="nothing to do: sparkctl goes on (a Spark's /etc/dgx-release says DGX_NAME=\"DGX "
                                   "Spark\")"))
        for problem in f.raw_errors:
            out.append(finding(NODE_FACTS_PARTIAL, node, "some facts could not be read",
                               evidence=problem, fix=f"run the command the evidence names on {node} to see why; "
                                                     "doctor reads the facts again each time"))
    return out


def check_clock_skew(s: Snapshot) -> list[Finding]:
    skew = clock_skew({n: s.facts[n] for n in s.order})
    return [finding(NODE_CLOCK_SKEW, node, "the clock is off from the other nodes",
                    evidence=f"{offset:+.1f} s from {skew.against} (allowed ±{MAX_SKEW_S:g} s)",
                    fix="sudo timedatectl set-ntp true (and check `timedatectl status`)")
            for node, offset in skew.offsets.items()]


def _model_need_gb(s: Snapshot, node: str) -> float | None:
    """What the models on `node` need of its memory (knowledge/fitcheck.py: one rank of each, summed over several
    worlds), when sparkctl knows their sizes."""
    if not serving_enabled(s.inventory):
        return None
    if len(s.inventory.worlds()) > 1:
        known = [gb for _model, gb in node_loads(s.inventory.served_models()).get(node, []) if gb is not None]
        return sum(known) or None
    spec = _serve_spec(s)
    if spec is None or spec.weights_gb is None:
        return None
    return needed_per_node_gb(spec.weights_gb, spec.tp_size, spec.draft_gb)


def _download_gb(s: Snapshot, node: str) -> float:
    """What the models on `node` take in its HF cache (weights and draft), as far as sparkctl knows their sizes."""
    if not serving_enabled(s.inventory):
        return 0.0
    if len(s.inventory.worlds()) > 1:
        specs = {m.spec.model: m.spec for m in s.inventory.served_models() if any(node in w.nodes for w in m.worlds)}
        return sum((spec.weights_gb or 0) + (spec.draft_gb or 0) for spec in specs.values())
    spec = _serve_spec(s)
    return ((spec.weights_gb or 0) + (spec.draft_gb or 0)) if spec else 0


def _model_loaded(s: Snapshot) -> bool:
    return s.probe(s.inventory.head.name).health_status == 200


def _model_memory(s: Snapshot, node: str, need_gb: float) -> list[Finding]:
    """Memory the model will not get although MemTotal says it fits: the page cache (the GPU allocates from unified
    memory and does not reclaim it: NVIDIA's advice is to drop caches), a CMA area (kernel docs, mm/cma: only
    movable pages may borrow it, and pinned GPU memory is not movable), swap in use."""
    m = s.facts[node].meminfo
    total, free, cached = m.get("MemTotal", 0) * 1024, m.get("MemFree", 0) * 1024, m.get("Cached", 0) * 1024
    need = need_gb * 1e9
    out: list[Finding] = []
    if not total or need > total:
        return out  # does not fit at all: the fit check's finding (model.fit)
    cma = m.get("CmaTotal", 0) * 1024
    if cma and need > total - cma:
        out.append(finding(NODE_CMA_RESERVED, node, "a CMA area leaves the model too little memory",
                           evidence=f"the model needs {_gb(need)} per node; {_gb(total)} in all, {_gb(cma)} of it "
                                    f"reserved for contiguous allocations (CmaTotal; {_gb(m.get('CmaFree', 0) * 1024)} "
                                    "free), which pinned GPU memory cannot use",
                           fix=f"lower or remove the cma= boot parameter on {node} (a person must: a kernel command "
                               "line change and a reboot)"))
    if not _model_loaded(s) and need > free and need <= free + cached:
        out.append(finding(NODE_PAGE_CACHE, node, "the page cache holds memory the model needs",
                           evidence=f"the model needs {_gb(need)} per node, {_gb(free)} is free and {_gb(cached)} is "
                                    "page cache: unified memory does not give the page cache back to the GPU "
                                    "(CUDA out of memory with a model that should fit)",
                           fix=DROP_CACHES))
    return out


def check_memory(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        f = s.facts[node]
        need_gb = _model_need_gb(s, node)
        if not f.mem_total_kb:
            continue
        total, avail, cached = f.mem_total_kb * 1024, f.mem_available_kb * 1024, f.page_cache_kb * 1024
        model = _model_memory(s, node, need_gb) if need_gb else []
        out += model
        swap_used = (f.meminfo.get("SwapTotal", 0) - f.meminfo.get("SwapFree", 0)
                     - f.meminfo.get("SwapCached", 0)) * 1024
        if swap_used > SWAP_USED_BYTES:
            out.append(finding(NODE_SWAP_IN_USE, node, "the node is swapping",
                               evidence=f"{_gb(swap_used)} of swap in use (SwapTotal - SwapFree - SwapCached); a "
                                        "model near the memory limit then pages, and loads and runs slowly",
                               fix="stop what else runs on the node; then sudo swapoff -a && sudo swapon -a brings "
                                   "the pages back"))
        if avail < total * LOW_MEMORY_FRACTION:
            out.append(finding(NODE_LOW_MEMORY, node, "little memory is free",
                               evidence=f"{_gb(avail)} available of {_gb(total)} (under "
                                        f"{LOW_MEMORY_FRACTION:.0%})",
                               fix="stop what else runs on the node (`ps aux --sort=-rss | head`); "
                                   f"the page cache can be dropped: {DROP_CACHES}"))
        elif cached > total * PAGE_CACHE_FRACTION and not any(x.id == "node.page_cache" for x in model):
            out.append(finding(NODE_PAGE_CACHE, node,
                               "a large page cache competes with the GPU for unified memory",
                               evidence=f"{_gb(cached)} page cache of {_gb(total)} (over {PAGE_CACHE_FRACTION:.0%}); "
                                        "CUDA out of memory with a model that should fit",
                               fix=DROP_CACHES, phase="node"))
    return out


def check_hf_cache_disk(s: Snapshot) -> list[Finding]:
    out = []
    for node in s.order:
        need_gb = _download_gb(s, node)
        f = s.facts[node]
        if f.hf_cache_free_bytes is None:
            continue
        # a node the model does not run on (left out of tp_size x pp_size) needs none of it
        missing = [m for m in s.probe(node).models if m.state != "complete"] if serves(s.inventory, node) else []
        floor = max(HF_CACHE_MIN_FREE_GB, need_gb * 1.05 if missing else 0) * 1e9
        if f.hf_cache_free_bytes < floor:
            # an error once a download is under way (or the server needs it); before that, a heads-up
            started = any(m.state == "incomplete" for m in missing) or s.probe(s.inventory.head.name).serve_log_exists
            severity: Severity = ("error" if missing and started and f.hf_cache_free_bytes < need_gb * 1e9
                                  else "warning")
            out.append(finding(DISK_HF_CACHE_LOW, node, "little disk space left in the HF cache",
                               evidence=f"{_gb(f.hf_cache_free_bytes)} free in {f.hf_cache}, want at least "
                                        f"{_gb(floor)}" + (f" ({len(missing)} checkpoint(s) still to download)"
                                                           if missing else ""),
                               fix=f"free space (`du -sh {shlex.quote(f.hf_cache)}/hub/*`, `hf cache scan`), or point "
                                   "container.hf_cache at a bigger disk", severity=severity))
    return out


def _serve_spec(s: Snapshot) -> ServeSpec | None:
    try:
        return s.inventory.serve_spec()
    except Exception:  # noqa: BLE001 - no servable model configured
        return None


def check_image_release(s: Snapshot) -> list[Finding]:
    if len(s.inventory.nodes) < 2:
        return []
    out = []
    images = {CLUSTER: s.inventory.container.image}
    for node in s.order:
        info = s.facts[node].containers.get(s.inventory.container.name)
        if info is not None and info.exists and info.image and info.image != s.inventory.container.image:
            images[node] = info.image
    for where, image in images.items():
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        if tag in KNOWN_BAD_RELEASES:
            out.append(finding(IMAGE_KNOWN_BAD_RELEASE, where,
                               f"image release {tag} has known multi-node problems",
                               evidence=f"{image}: {KNOWN_BAD_RELEASES[tag]}",
                               fix="set container.image to nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12 (the "
                                   "two-Spark playbook's), then sparkctl cluster bootstrap"))
    return out


CHECKS = [check_reachability, check_busy, check_access, check_clock_skew, check_memory, check_hf_cache_disk,
          check_image_release]
