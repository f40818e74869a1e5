"""The test command's pins (requirements/test.txt) and pyproject.toml's ranges agree, and the suite runs on the pins.

The lock is compiled from pyproject.toml (docs/development.md says how): every direct dependency is pinned at a
version its range admits, with hashes; every runtime dependency has a tested upper bound, so that `pipx install .` on
a fresh machine does not meet a new major release nobody has tried; and, under the test command, what is installed
is exactly what the lock says.
"""

from __future__ import annotations

import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # the lock pins tomli for 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "test.txt"


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _lock_entries() -> list[tuple[Requirement, list[str]]]:
    """Each entry of the lock: the requirement line (with its marker) and its hashes."""
    text = re.sub(r"\\\n\s*", " ", LOCK.read_text())  # join the continuation lines
    entries = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        hashes = re.findall(r"--hash=(\S+)", line)
        entries.append((Requirement(re.sub(r"\s*--hash=\S+", "", line)), hashes))
    return entries


def _pinned(python: str) -> dict[str, Version]:
    """What the lock installs on a Python of that version (markers evaluated as on this machine otherwise)."""
    env = default_environment() | {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python}
    pins = {}
    for requirement, _ in _lock_entries():
        if requirement.marker is None or requirement.marker.evaluate(env):
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = Version(spec.version)
    return pins


def _direct() -> list[Requirement]:
    project = _pyproject()["project"]
    return [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]


def test_every_lock_entry_is_one_exact_version_with_hashes():
    for requirement, hashes in _lock_entries():
        specs = list(requirement.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{requirement}: pin one version with =="
        assert hashes and all(h.startswith("sha256:") for h in hashes), f"{requirement.name}: no sha256 hashes"


@pytest.mark.parametrize("python", ["3.10.12", "3.11.2", "3.12.3", "3.13.1"])
def test_every_direct_dependency_is_pinned_within_its_range(python):
    pins = _pinned(python)
    for requirement in _direct():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in {LOCK.name}: compile the lock again (docs/development.md)"
        assert requirement.specifier.contains(pins[name], prereleases=False), (
            f"{LOCK.name} pins {name} {pins[name]}, outside pyproject.toml's {requirement.specifier}")


def test_every_runtime_dependency_has_a_tested_upper_bound():
    for requirement in (Requirement(r) for r in _pyproject()["project"]["dependencies"]):
        assert any(spec.operator == "<" for spec in requirement.specifier), (
            f"{requirement.name} has no upper bound: a new major release would reach every new install untried")


@pytest.mark.skipif(os.environ.get("SPARKCTL_TEST_LOCK") is None, reason="only under the test command's pinned venv")
def test_the_suite_runs_on_exactly_the_pinned_versions():
    python = ".".join(map(str, sys.version_info[:3]))
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in metadata.distributions()}
    for name, version in _pinned(python).items():
        assert installed.get(name) == version, f"{name}: {installed.get(name)} installed, {version} pinned"
