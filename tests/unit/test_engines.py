"""The engine registry: one entry per engine, its defaults real, and shared code that asks an engine what it needs
instead of comparing engine names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from sparkctl.engines import DEFAULT_ENGINE, ENGINES, EngineName
from sparkctl.inventory.sections import ServeSettings
from sparkctl.knowledge import trtllm_releases, vllm_releases
from sparkctl.lab.image import VLLM_IMAGE

PACKAGE = Path(__file__).resolve().parents[2] / "sparkctl"

#: Each engine's own modules: they may name their engine (the lab stands in for each; knowledge holds each
#: release table).
ENGINE_MODULES = {"engines/__init__.py", "knowledge/trtllm_releases.py", "knowledge/vllm_releases.py",
                  "inventory/vllm_check.py", "inventory/release_check.py", "plan/trtllm.py", "plan/vllm.py",
                  "doctor/checks/vllm.py"}
BRANCH = re.compile(r"""[=!]= ["'](?:trtllm|vllm)["']|\.vllm is (?:not )?None""")


def test_every_engine_name_has_one_entry_and_the_inventory_takes_exactly_those():
    assert set(ENGINES) == set(get_args(EngineName)) and DEFAULT_ENGINE in ENGINES
    assert all(name == engine.name for name, engine in ENGINES.items())
    field = ServeSettings.model_fields["engine"].annotation
    assert set(get_args(get_args(field)[0])) == set(ENGINES)


@pytest.mark.parametrize("name, release_of", [("trtllm", trtllm_releases.release_of),
                                              ("vllm", vllm_releases.release_of)])
def test_each_default_image_is_a_release_sparkctl_knows(name, release_of):
    assert release_of(ENGINES[name].container_image) is not None


def test_the_lab_names_its_vllm_image_as_the_product_s_default():
    assert ENGINES["vllm"].container_image == VLLM_IMAGE


def test_mpi_is_needed_exactly_where_the_head_s_unit_starts_every_rank():
    for engine in ENGINES.values():
        assert engine.needs_mpi is not engine.unit_per_rank
        # an engine whose ranks meet by themselves must be told which address is theirs
        assert engine.needs_mpi or engine.host_ip_env


def test_no_shared_module_compares_engine_names():
    branching = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("lab/") or rel in ENGINE_MODULES:
            continue
        if BRANCH.search(path.read_text()):
            branching.add(rel)
    assert not branching, f"ask the engine (sparkctl/engines, plan/launch.py) instead of naming one: {branching}"
