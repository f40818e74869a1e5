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
from tests.lab.conftest import _require_lab, readme_done

pytestmark = pytest.mark.lab

README = Path(__file__).resolve().parents[2] / "README.md"
CHAT = 'sparkctl serve chat .sparkctl-lab/inventory.yaml "hello"'


def try_it_lines() -> list[str]:
    section = README.read_text().split("## Try it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^sparkctl lab up .*$", section, re.M)


def try_it_line(engine: str = "trtllm") -> str:
    """The README's line for ENGINE: the vLLM one serves a vLLM preset, the SGLang one an SGLang preset."""
    others = {"vllm", "sglang"} - {engine}
    (line,) = [x for x in try_it_lines() if not any(o in x for o in others) and (engine == "trtllm" or engine in x)]
    return line


@pytest.fixture(scope="module", autouse=True)
def say_when_done(tmp_path_factory):
    """Split over workers, the labs wait for this module (tests/lab/conftest.py, after_the_readme)."""
    yield
    readme_done(tmp_path_factory).touch()


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


@pytest.fixture
def fresh_dir(tmp_path):
    _require_lab()
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    (tmp_path / "home").mkdir()
    yield tmp_path, env
    subprocess.run(["sparkctl", "lab", "down"], cwd=tmp_path, env=env, capture_output=True, timeout=300)


def test_the_readme_vllm_line_works_from_a_fresh_directory(fresh_dir):
    """The vLLM line, as written, in a fresh directory with no state: vLLM's image is the lab image under the name
    the product uses by default, which `lab up` gives it (removed first here; the build itself from no image at all
    is the line above's)."""
    cwd, env = fresh_dir
    assert len(try_it_lines()) == 3
    line = try_it_line("vllm")
    assert "--serve llama-3.3-70b-vllm" in line and "cluster bootstrap .sparkctl-lab/inventory.yaml" in line
    subprocess.run(["podman", *image.podman_store_args(), "rmi", image.VLLM_IMAGE], capture_output=True, timeout=120)
    run = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "vllm-multinode" in run.stdout + run.stderr
    chat = subprocess.run(["bash", "-c", CHAT], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stdout + chat.stderr


def test_the_readme_sglang_line_works_from_a_fresh_directory(fresh_dir):
    """The SGLang line, as written, in a fresh directory with no state, from no SGLang image: the lab image under the
    name the product uses by default, which `lab up` gives it."""
    cwd, env = fresh_dir
    line = try_it_line("sglang")
    assert "--serve llama-3.3-70b-sglang-eagle3" in line and "cluster bootstrap .sparkctl-lab/inventory.yaml" in line
    subprocess.run(["podman", *image.podman_store_args(), "rmi", image.SGLANG_IMAGE], capture_output=True,
                   timeout=120)
    run = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "sglang-multinode" in run.stdout + run.stderr
    chat = subprocess.run(["bash", "-c", CHAT], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stdout + chat.stderr
