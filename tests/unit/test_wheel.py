"""The wheel carries the templates: build it, install it into a fresh venv, render a plan from outside the checkout.

No network: the venv sees the running interpreter's site-packages (the dependencies are installed there, in the
test command's own venv) and pip installs the wheel alone with --no-deps --no-index. The only test here that builds
anything (~20-40 s).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("build")
    # Build from a copy: `build` writes into the tree (build/, *.egg-info) and others work in this checkout.
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "sparkctl", "templates", "inventories"):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    # With the build backend installed, no isolated environment (and no download) is needed.
    isolation = [] if importlib.util.find_spec("hatchling") is None else ["--no-isolation"]
    _run([sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", str(out)], cwd=src)
    (wheel,) = out.glob("sparkctl-*.whl")
    return wheel


def test_wheel_contains_the_templates(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).name for n in names if n.startswith("sparkctl/templates/")}
    assert shipped == {p.name for p in (REPO / "templates").iterdir() if p.is_file()}
    assert not any(n.startswith(("templates/", "tests/")) for n in names)


def test_installed_wheel_renders_a_plan_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    # --system-site-packages would be the base interpreter's, not this venv's: name ours after the venv's own
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site.stdout.strip()) / "zz-test-deps.pth").write_text("".join(f"{path}\n" for path in ours))
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "--quiet",
          str(wheel)], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy2(REPO / "inventories" / "two-sparks.yaml", elsewhere / "two-sparks.yaml")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["HOME"] = str(tmp_path)
    where = _run([str(python), "-c", "import sparkctl.shipped as r; print(r.templates_dir())"], elsewhere, env)
    templates = Path(where.stdout.strip())
    assert templates.is_relative_to(venv), f"templates come from {templates}, not from the installed wheel"
    result = _run([str(venv / "bin" / "sparkctl"), "cluster", "plan", "two-sparks.yaml"], elsewhere, env)
    assert "# Managed by sparkctl (cluster spark-pair): the CX-7 fabric interfaces of spark1." in result.stdout
    assert "        - 192.168.100.10/24\n" in result.stdout and "      mtu: 9000\n" in result.stdout
