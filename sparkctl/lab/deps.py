"""Can this machine run a lab? Root, Linux, and the Debian packages the lab drives."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess

from sparkctl.errors import BadInput, SparkctlError

# The runtime's own needs; the image builder adds its own (sparkctl.lab.image.required_packages).
RUNTIME_PACKAGES = ["openssh-server", "netplan.io", "network-manager", "iproute2", "podman", "podman-docker", "runc",
                    "sudo", "lldpd", "systemd", "dbus", "util-linux", "openmpi-bin", "python3-mpi4py", "iputils-ping"]


def required_packages() -> list[str]:
    try:
        from sparkctl.lab.image import required_packages as image_packages
    except ImportError:  # the image module is optional for a runtime-only check
        image_packages = list
    return sorted(set(RUNTIME_PACKAGES) | set(image_packages()))


def missing_packages(packages: list[str]) -> list[str]:
    result = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n", *packages],
                            capture_output=True, text=True, timeout=30)
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in packages if p not in installed]


def install_line(packages: list[str]) -> str:
    return "apt-get install -y " + " ".join(shlex.quote(p) for p in packages)


def check_machine(need_packages: bool = True) -> None:
    """One clear line (exit 2) when the lab cannot run here."""
    if platform.system() != "Linux":
        raise BadInput(f"the lab needs Linux (this is {platform.system()})")
    if os.geteuid() != 0:
        raise BadInput("the lab needs root (namespaces, bridges, mounts)", hint="run it with sudo")
    if need_packages:
        missing = missing_packages(required_packages())
        if missing:
            raise BadInput(f"missing packages: {' '.join(missing)}",
                           hint=f"run `{install_line(missing)}` or pass --install-deps")


def install_packages(log=print) -> None:
    if os.geteuid() != 0:
        raise BadInput("installing the lab's packages needs root", hint="run it with sudo")
    missing = missing_packages(required_packages())
    if not missing:
        return
    log(f"installing: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *missing]):
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if result.returncode != 0:
            tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
            raise SparkctlError(f"`{' '.join(argv[:3])}` failed: {' '.join(tail)}")
