"""PURE: how a container differs from its planned spec (container.run recreates it; doctor reports it)."""

from __future__ import annotations

from sparkctl.facts import ContainerInfo
from sparkctl.plan.container import ContainerSpec
from sparkctl.secrets import MASK

#: What the container's own sshd is called in `ss -p` (OpenSSH 9.8+ forks "sshd-session" per login).
SSHD_NAMES = ("sshd", "sshd-session")


def spec_differences(spec: ContainerSpec, current: ContainerInfo) -> list[str]:
    """What differs between the planned spec and the running container, one line per setting."""
    out = []
    if current.image != spec.image:
        out.append(f"image {current.image} -> {spec.image}")
    # Only the planned keys: the image brings its own env (PATH, NCCL_VERSION ...) that is not ours to judge.
    for key in sorted(spec.env):
        have = current.env.get(key)
        if have == MASK:
            continue  # facts never carry secret-looking values; the spec label still covers them
        if have != spec.env[key]:
            out.append(f"env {key}: {have if have is not None else '(unset)'} -> {spec.env[key]}")
    have_mounts = {m.get("Destination", "").rstrip("/"): m.get("Source", "").rstrip("/")
                   for m in current.mounts}
    for host, inside, _mode in spec.mounts:
        got = have_mounts.get(inside.rstrip("/"))
        if got != host.rstrip("/"):
            out.append(f"mount {inside}: {got or '(none)'} -> {host}")
    if current.restart_policy is not None and current.restart_policy != spec.restart:
        out.append(f"restart policy {current.restart_policy} -> {spec.restart}")
    return out
