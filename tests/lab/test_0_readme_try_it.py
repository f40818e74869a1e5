"""The README's "Try it" line, as written, from nothing: no lab image, no lab, no state, a fresh directory.

Named to run first among the lab tests: on a fresh machine (CI) nothing has built the image before it, and this
proves the one line a newcomer types is all it takes. It removes the image first, so it proves the same here.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from sparkctl.lab import image
from tests.lab.conftest import _require_lab

pytestmark = pytest.mark.lab

README = Path(__file__).resolve().parents[2] / "README.md"
CHAT = 'sparkctl serve chat .sparkctl-lab/inventory.yaml "hello"'


def try_it_line() -> str:
    section = README.read_text().split("## Try it", 1)[1].split("\n## ", 1)[0]
    (line,) = re.findall(r"^sparkctl lab up .*$", section, re.M)
    return line


@pytest.fixture
def fresh(tmp_path):
    _require_lab()
    subprocess.run(["podman", *image.podman_store_args(), "rmi", "-f", image.image_ref()], capture_output=True,
                   timeout=120)
    assert image.installed_recipe() is None
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "home").mkdir()
    yield tmp_path, env
    subprocess.run(["sparkctl", "lab", "down"], cwd=tmp_path, env=env, capture_output=True, timeout=300)


def test_the_readme_line_works_on_a_fresh_machine(fresh):
    cwd, env = fresh
    line = try_it_line()
    assert "--serve" in line and "cluster bootstrap .sparkctl-lab/inventory.yaml" in line
    run = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "lab image: building" in run.stderr, "the image was built by `lab up`, with progress"
    assert image.installed_recipe() == image.recipe_hash()
    assert CHAT in README.read_text()
    chat = subprocess.run(["bash", "-c", CHAT], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stdout + chat.stderr
