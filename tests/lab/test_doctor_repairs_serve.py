"""The serve phase's repairable doctor findings, seeded on one shared lab pair that serves (the qwen3-235b-eagle3
preset through the lab's TensorRT-LLM stand-in): doctor names each on its node, `doctor --fix` repairs it (healthy
after), a bootstrap rerun then changes nothing; seeded again, a plain bootstrap rerun repairs it, doctor is healthy
and the next rerun changes nothing (the serving unit's missing, failed and looping states: one way each).
(tests/lab/test_doctor_repairs.py: the rest, on a pair that does not serve.)
"""

from __future__ import annotations

import os

import pytest
import yaml

from tests.lab.doctor_kit import bootstrap, changed, doctor, failed, problems
from tests.lab.serve_kit import SEEDS, SERVE, TOKEN

pytestmark = pytest.mark.lab

@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    return {**os.environ, "HF_TOKEN": TOKEN, "XDG_STATE_HOME": str(tmp_path_factory.mktemp("doctor-serve-state"))}


@pytest.fixture(scope="module")
def served(lab_factory, env, tmp_path_factory):
    lab = lab_factory(2, "pair", port=1)
    document = yaml.safe_load(lab.inventory_path.read_text())
    document["serve"] = SERVE
    # NCCL says in the serve log which network it chose (nccl.socket_fallback is read there)
    document.setdefault("container", {}).setdefault("env", {})["NCCL_DEBUG"] = "INFO"
    path = tmp_path_factory.mktemp("inv") / "serve.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    lab.serve_inventory = str(path)
    lab.serve_env = env
    code, events = bootstrap(lab, env=env, inventory=lab.serve_inventory)
    assert code == 0, failed(events)
    healthy = doctor(lab, env=env, inventory=lab.serve_inventory)
    assert healthy["healthy"], healthy["findings"]
    lab.baseline = problems(healthy)
    assert {i for i, _ in lab.baseline} <= {"fabric.speed_low"}, lab.baseline
    return lab


def look(lab, env, *args: str) -> dict:
    return doctor(lab, *args, env=env, inventory=lab.serve_inventory)


def seen(lab, report: dict) -> set[tuple[str, str]]:
    """Beyond the healthy lab's own: and while a Qwen3-235B checkpoint is missing, a lab disk smaller than one
    rightly warns (disk.hf_cache_low, a person's); that warning is no part of the seeded fault."""
    return {p for p in problems(report) - lab.baseline if p[0] != "disk.hf_cache_low"}


def rerun(lab, env) -> tuple[int, list]:
    return bootstrap(lab, env=env, inventory=lab.serve_inventory)


@pytest.fixture
def restore(served, env, request):
    """A case that fails leaves the lab repaired for the next one."""
    yield
    if getattr(request.node, "failed_call", False):
        rerun(served, env)


#: What the serve phase repairs by starting the server again (the unit missing, failed or looping, the server down,
#: hung, or on sockets) is repaired by the same tasks whichever command runs the phase: each is seeded in one of
#: the two, both commands covered (a looping unit takes 20 s to seed: two ends and the wait between; a restart of
#: the server ten). The model, token and gateway seeds go both ways.
RERUN_ONLY = ("unit-failed", "nccl-socket-fallback")
FIX_ONLY = ("unit-looping", "unit-missing", "serve-hung", "serve-down")
FIX_SEEDS = [s for s in SEEDS if s.name not in RERUN_ONLY]
RERUN_SEEDS = [s for s in SEEDS if s.name not in FIX_ONLY]


@pytest.mark.parametrize("seed", FIX_SEEDS, ids=[s.name for s in FIX_SEEDS])
def test_doctor_fix_repairs_it_and_a_rerun_changes_nothing(served, env, restore, seed):
    seed.seed(served)
    report = look(served, env)
    assert seen(served, report) == {(seed.finding, seed.node), *seed.also}, report["findings"]
    fixed = look(served, env, "--fix")
    assert fixed["fix"]["ran"] and fixed["fix"]["exit_status"] == 0, fixed["fix"]
    assert fixed["healthy"] and seen(served, fixed) == set(), fixed["findings"]
    code, events = rerun(served, env)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))


@pytest.mark.parametrize("seed", RERUN_SEEDS, ids=[s.name for s in RERUN_SEEDS])
def test_a_bootstrap_rerun_repairs_it_and_the_next_changes_nothing(served, env, restore, seed):
    seed.seed(served)
    assert (seed.finding, seed.node) in seen(served, look(served, env))
    code, events = rerun(served, env)
    assert code == 0 and changed(events), (changed(events), failed(events))
    after = look(served, env)
    assert after["healthy"] and seen(served, after) == set(), after["findings"]
    code, events = rerun(served, env)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))
