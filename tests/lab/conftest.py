"""Fixtures that bring labs of simulated Sparks up and ALWAYS tear them down.

Lab tests skip only where a lab cannot exist (not root, not Linux); with SPARKCTL_REQUIRE_LAB=1 (CI)
they fail instead, so a broken machine never passes as "all skipped".
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import README_MODULE


def _lab_unavailable() -> str | None:
    if platform.system() != "Linux":
        return "the lab needs Linux"
    if os.geteuid() != 0:
        return "the lab needs root"
    return None


def _require_lab() -> None:
    reason = _lab_unavailable()
    if reason is None:
        return
    if os.environ.get("SPARKCTL_REQUIRE_LAB") == "1":
        pytest.fail(f"SPARKCTL_REQUIRE_LAB=1 but {reason}")
    pytest.skip(reason)


def readme_done(tmp_path_factory) -> Path:
    """Where the README's module says it is done, for the workers of this run (pytest-xdist gives each a temp dir
    under one of the run's)."""
    return tmp_path_factory.getbasetemp().parent / "readme-done"


def after_the_readme(request) -> None:
    """Split over workers, a lab waits for the README's lines to be done: they remove the lab image and build it
    from nothing, which would pull it from under a running lab. They are handed out first (scripts/test keeps the
    order collected, tests/conftest.py puts them first), so the worker that runs them never waits for itself.
    Alone, the README's run first anyway."""
    if not hasattr(request.config, "workerinput"):
        return
    if not any(item.nodeid.startswith(README_MODULE) for item in request.session.items):
        return
    done = readme_done(request.getfixturevalue("tmp_path_factory"))
    # longer than the README's lines may take by their own limits (three, each up to 1500 + 300 + 300 s): the wait
    # must never be what fails (in the session's fixture, its failure would stand for every later lab)
    if not poll(done.exists, timeout=3 * 2100 + 600, interval=1):
        pytest.fail(f"the README's lines did not say they were done ({done})")


@pytest.fixture(scope="session")
def lab_image(request) -> str:
    """The lab's container image, built once per machine (cached by recipe hash)."""
    _require_lab()
    after_the_readme(request)
    from sparkctl.lab.image import ensure_image

    return ensure_image()


@pytest.fixture(scope="module")
def lab_factory(tmp_path_factory, request) -> Iterator[Callable]:
    """lab_factory(nodes, topology, port=1, sudo_password=False, ring_order=None, renderer="networkd") -> Lab; every
    lab is torn down at the end. The renderer is named explicitly here: the lab's default is NetworkManager (DGX
    OS's), and tests/lab/test_networkmanager.py runs bootstrap, drift and doctor under both."""
    _require_lab()
    after_the_readme(request)
    from sparkctl.lab.lab import Lab

    labs: list[Lab] = []

    def make(nodes: int = 2, topology: str = "pair", port: int = 1, sudo_password: bool = False,
             ring_order: str | None = None, renderer: str = "networkd") -> Lab:
        directory = tmp_path_factory.mktemp(f"lab-{topology}{nodes}-{renderer}")
        try:
            lab = Lab.up(directory, nodes=nodes, topology=topology, port=port, sudo_password=sudo_password,
                         ring_order=ring_order, renderer=renderer)
        except BaseException:
            # Lab.up tears down what it built; this catches the state a crash left behind
            if (directory / "state.json").exists():
                Lab.load(directory).down()
            raise
        labs.append(lab)
        return lab

    yield make
    errors = []
    for lab in labs:
        if lab.state.phase != "down":
            errors += lab.down()
    assert not errors, f"teardown left: {errors}"


@pytest.fixture(scope="module")
def lab_pair(lab_factory):
    return lab_factory(2, "pair", port=1)


def ssh(lab, node: str, command: str, timeout: float = 60, input: str | None = None):
    return subprocess.run(lab.ssh_argv(node, command), capture_output=True, text=True, timeout=timeout,
                          input=input)


def poll(check: Callable[[], object], timeout: float = 15, interval: float = 0.1):
    """Until check() is truthy; returns its value, or the last one after the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def leftovers_of(lab) -> list[str]:
    """Anything of this lab still on the machine: namespaces, links, mounts of DIR, processes, cgroups."""
    names, found = lab.names, []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [f"netns {line.split()[0]}" for line in netns.splitlines() if f"sl{names.lab_id}" in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if f"sl{names.lab_id}" in line]
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            if str(lab.dir) in mountinfo.read_text():
                found.append(f"mount of {lab.dir} in {mountinfo.parent.name}")
        except OSError:
            continue
    for node in lab.state.nodes:
        for resource in lab.state.of_kind("process"):
            from sparkctl.lab.state import process_is_alive

            if process_is_alive(int(resource.name), resource.starttime):
                found.append(f"process {resource.name} ({node.name})")
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/sparkctl-lab/{names.lab_id}")]
    return sorted(set(found))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """`item.failed_call`: the test body failed (a fixture's teardown may then restore what the test broke)."""
    report = yield
    if report.when == "call" and report.failed:
        item.failed_call = True
        for name, text in _node_journals(item):
            report.sections.append((f"the journal of {name} (its last sshd, logind, docker and network lines)", text))
    return report


#: what a failed lab test shows of each node of its lab, the end of its journal: sshd (its sessions log from their own
#: scopes, so by name), logind, docker, the network's renderers. A lost connection or a container that did not answer
#: is told by them, and the lab is gone by the time anyone reads the report. Matches joined by `+` (journalctl: any).
JOURNAL_MATCHES = ("SYSLOG_IDENTIFIER=sshd", "SYSLOG_IDENTIFIER=sshd-session", "SYSLOG_IDENTIFIER=systemd-logind",
                   "_SYSTEMD_UNIT=docker.service", "_SYSTEMD_UNIT=NetworkManager.service",
                   "_SYSTEMD_UNIT=systemd-networkd.service")


def _node_journals(item) -> list[tuple[str, str]]:
    from sparkctl.lab.lab import Lab

    matches = " + ".join(JOURNAL_MATCHES)
    out = []
    labs = {id(v): v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Lab)}
    for lab in labs.values():
        for node in lab.nodes:
            try:
                got = lab.exec(node.name, f"journalctl -q --no-pager -o short-precise -n 40 {matches}", timeout=10)
            except Exception as exc:  # noqa: BLE001 (a report's extra never fails it)
                out.append((node.name, f"not read: {exc}"))
                continue
            out.append((node.name, got.stdout[-6000:] or got.stderr[-2000:]))
    return out


def pytest_collection_modifyitems(config, items):
    """Every test under tests/lab is a lab test, marked or not: `-m "not lab"` never builds a lab."""
    lab_dir = Path(__file__).parent
    for item in items:
        if lab_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.lab)
