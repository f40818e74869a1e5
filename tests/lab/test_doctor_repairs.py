"""Every repairable doctor finding the lab can hold, seeded on one shared, bootstrapped lab pair (port 1):

1. seeded, `doctor` names it on its node (and nothing else but what the seed says it causes);
2. `doctor --fix` repairs it: the diagnosis after the fix is healthy and no longer has it;
3. a bootstrap rerun after that changes nothing;
4. seeded again (with others that touch different things: BOOTSTRAP_GROUPS), a plain bootstrap rerun repairs it
   (exit 0, something changed, nothing failed), `doctor` is healthy, and the rerun after that changes nothing.
A case that fails restores the lab with a bootstrap, so the next case starts healthy.

Findings that need a person: tests/lab/test_doctor.py (on the lab) and tests/unit/test_doctor_person.py.
Repairable findings this module does not seed say where they are tested (ELSEWHERE).
"""

from __future__ import annotations

import pytest

from sparkctl.doctor.catalog import FINDINGS
from tests.lab.conftest import poll
from tests.lab.doctor_kit import Seed, bootstrap, changed, doctor, failed, problems
from tests.lab.nm_kit import NM_SEEDS
from tests.lab.seeds_kit import seeds
from tests.lab.serve_kit import SEEDS as SERVE_SEEDS
from tests.lab.serve_kit import SGLANG_SEEDS, VLLM_SEEDS

pytestmark = pytest.mark.lab


SEEDS = seeds("CLUSTER")


@pytest.fixture(scope="module")
def lab(lab_factory):
    lab = lab_factory(2, "pair", port=1)
    code, events = bootstrap(lab)
    assert code == 0, failed(events)
    healthy = doctor(lab)
    assert healthy["healthy"], healthy["findings"]
    # what a healthy lab warns about anyway: its veths link at 10 Gb/s (fabric.speed_low), nothing else
    lab.baseline = problems(healthy)
    assert {i for i, _ in lab.baseline} <= {"fabric.speed_low"}, lab.baseline
    return lab


def seen(lab, report: dict) -> set[tuple[str, str]]:
    """Errors and warnings beyond the healthy lab's own."""
    return problems(report) - lab.baseline


def cluster_name(lab) -> str:
    return next(line.split(":", 1)[1].strip() for line in lab.inventory_path.read_text().splitlines()
                if line.strip().startswith("name:") and "spark" not in line)


def seed_node(name: str) -> str:
    return next(s.node for s in SEEDS if s.name == name)


def seed_of(lab, name: str) -> Seed:
    return next(s for s in seeds(cluster_name(lab)) if s.name == name)


def expected(seed: Seed) -> set[tuple[str, str]]:
    return {(seed.finding, seed.node), *seed.also}


def found(lab, *seeds: Seed) -> dict:
    """doctor, until every seeded fault shows (some take a moment: networkd drops an address after the carrier)."""
    reports: list[dict] = []

    def look():
        reports.append(doctor(lab))
        return all((seed.finding, seed.node) in seen(lab, reports[-1]) for seed in seeds)

    poll(look, timeout=120, interval=0.5)  # returns at the first report that has it
    return reports[-1]


@pytest.fixture
def restore(lab, request):
    """A case that fails leaves the lab repaired for the next one (a healthy case already ends healthy)."""
    yield
    if getattr(request.node, "failed_call", False):
        bootstrap(lab)


#: Repairable ids not seeded in this module, and where they are tested instead.
ELSEWHERE = {
    # the serve phase's, and what NCCL said in the serve log, on a serving lab: tests/lab/test_doctor_repairs_serve.py
    "model.absent": "serve", "model.incomplete": "serve", "hf.token_missing": "serve", "serve.down": "serve",
    "serve.health": "serve", "nccl.socket_fallback": "serve", "serve.gateway_down": "serve",
    "serve.collector_down": "serve",
    # a shard changed on the worker of a pair that copies the model: tests/lab/test_model_distribute.py
    "model.changed": "distribute",
    "serve.unit_missing": "serve", "serve.unit_failed": "serve", "serve.unit_looping": "serve",
    # NetworkManager's, on a NetworkManager-rendered pair: tests/lab/test_networkmanager.py (NM_SEEDS)
    "nm.competing_profile": "networkmanager", "nm.twin_unmanaged": "networkmanager",
    # vLLM's ranks, on a pair and a ring of three serving with vLLM: tests/lab/test_bootstrap_vllm.py (VLLM_SEEDS)
    "vllm.wrong_nic": "vllm", "vllm.ranks_one_node": "vllm",
    # SGLang's ranks, the same way: tests/lab/test_bootstrap_sglang.py (SGLANG_SEEDS)
    "sglang.wrong_address": "sglang", "sglang.ranks_one_node": "sglang",
    # the gateway serving another certificate than serve.tls names, on a pair serving over HTTPS:
    # tests/lab/test_management_network.py
    "serve.tls_stale": "management",
}


#: What ELSEWHERE may name: the lab modules that seed repairable findings.
LAB_MODULES = {"serve": "test_doctor_repairs_serve", "networkmanager": "test_networkmanager",
               "distribute": "test_model_distribute",
               "vllm": "test_bootstrap_vllm", "sglang": "test_bootstrap_sglang",
               "management": "test_management_network"}


def test_every_repairable_id_is_seeded_here_or_said_where_it_is_tested():
    repairable = {i for i, r in FINDINGS.items() if r.repairable}
    seeded = {s.finding for s in SEEDS}
    assert repairable - seeded - set(ELSEWHERE) == set()
    assert seeded & set(ELSEWHERE) == set() and set(ELSEWHERE) <= repairable
    # and only where a lab test module seeds them: a unit test does not prove a repair on a node
    assert set(ELSEWHERE.values()) <= set(LAB_MODULES), set(ELSEWHERE.values()) - set(LAB_MODULES)
    # and where ELSEWHERE says, they are seeded
    assert {s.finding for s in SERVE_SEEDS} == {i for i, w in ELSEWHERE.items() if w == "serve"}
    assert {s.finding for s in NM_SEEDS} >= {i for i, w in ELSEWHERE.items()
                                                                 if w == "networkmanager"}
    assert set(VLLM_SEEDS) == {i for i, w in ELSEWHERE.items() if w == "vllm"}
    assert set(SGLANG_SEEDS) == {i for i, w in ELSEWHERE.items() if w == "sglang"}


#: Seeds whose repair another seed carries through doctor --fix, seeded on the bootstrap path only: both twins set
#: down is fabric.port_down as one twin is (networkd sets them up again: twin-set-down); a container started with a
#: wrong interface setting is recreated from its node's plan whichever setting it is (env-down, ib-hca-missing), and
#: that doctor names each of these on its node alone is held in its bootstrap group (EXACT_GROUPS).
RERUN_ONLY = ("both-twins-set-down", "env-absent", "env-management", "ib-hca-partial", "env-unset")


@pytest.mark.parametrize("name", [s.name for s in SEEDS if s.name not in RERUN_ONLY])
def test_doctor_fix_repairs_it_and_a_rerun_changes_nothing(lab, restore, name):
    seed = seed_of(lab, name)
    seed.seed(lab)
    report = found(lab, seed)
    assert seen(lab, report) == expected(seed), report["findings"]
    assert not report["healthy"] or seed.finding in {"nccl.ib_hca_partial", "env.unset"}  # those warn
    (finding,) = [f for f in report["findings"] if (f["id"], f["node"]) == (seed.finding, seed.node)][:1]
    assert finding["closed_by"]["tasks"], finding
    fixed = doctor(lab, "--fix")
    assert fixed["fix"]["ran"] and fixed["fix"]["exit_status"] == 0, fixed["fix"]
    assert fixed["healthy"] and seen(lab, fixed) == set(), fixed["findings"]
    code, events = bootstrap(lab)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))


#: The same seeds for the bootstrap path, several at once where they touch different things (a plain bootstrap
#: converges them together; that each is named on its node alone is the doctor path's test above).
BOOTSTRAP_GROUPS = [
    ("twin-set-down", "mtu", "link-local", "address-foreign", "netplan-conflict", "netplan-drift"),
    ("both-twins-set-down", "ssh-mesh"),
    ("twins-one-subnet", "address-missing", "address-duplicate"),
    # an extra address not with both twins down: the link going down takes it away before anything could repair it
    ("container-spec-drift", "container-exited", "address-extra"),
    ("container-restarting",),
    ("container-missing", "container-ssh", "hostfile"),
    ("env-down", "env-absent"),
    ("env-management", "ib-hca-missing"),
    ("ib-hca-partial", "env-unset"),
    ("container-exposed",),
    ("port-exposed",),
]
#: Groups of one seed per node that touch only that node's container: doctor names exactly what each seed says,
#: each on its node alone (as the doctor path's test does for a seed by itself).
EXACT_GROUPS = [("env-down", "env-absent"), ("env-management", "ib-hca-missing"), ("ib-hca-partial", "env-unset")]


#: Seeds that another seed of their group hides from doctor: with both twins down no mesh pair can be tried;
#: without its container, neither the container's ssh nor its hostfile can be read.
HIDDEN_BY = {"ssh-mesh": "both-twins-set-down", "container-ssh": "container-missing", "hostfile": "container-missing"}


def test_the_bootstrap_groups_hold_every_seed_once():
    names = [n for group in BOOTSTRAP_GROUPS for n in group]
    assert sorted(names) == sorted(s.name for s in SEEDS)
    # a seed left out of the doctor path is named alone in its group: one seed per node, nothing hidden
    exact = {n for group in EXACT_GROUPS for n in group}
    assert set(EXACT_GROUPS) <= set(BOOTSTRAP_GROUPS) and set(RERUN_ONLY) - {"both-twins-set-down"} <= exact
    for group in EXACT_GROUPS:
        assert len({seed_node(n) for n in group}) == len(group) and not set(group) & set(HIDDEN_BY), group


@pytest.mark.parametrize("group", BOOTSTRAP_GROUPS, ids=["+".join(g) for g in BOOTSTRAP_GROUPS])
def test_a_bootstrap_rerun_repairs_them_and_the_next_changes_nothing(lab, restore, group):
    chosen = [seed_of(lab, name) for name in group]
    for seed in chosen:
        seed.seed(lab)
    shown = [seed for seed in chosen if HIDDEN_BY.get(seed.name) not in group]
    report = found(lab, *shown)
    assert {(seed.finding, seed.node) for seed in shown} <= seen(lab, report), report["findings"]
    if group in EXACT_GROUPS:
        assert seen(lab, report) == set().union(*(expected(seed) for seed in chosen)), report["findings"]
    code, events = bootstrap(lab)
    assert code == 0 and changed(events), (changed(events), failed(events))
    after = doctor(lab)
    assert after["healthy"] and seen(lab, after) == set(), after["findings"]
    code, events = bootstrap(lab)
    assert code == 0 and changed(events) == set(), (changed(events), failed(events))


def test_a_twin_set_down_is_one_finding_on_its_node_and_nobody_is_sent_to_the_cables(lab, restore):
    """The issue's case, word for word: one finding, on spark1; no "check the cable" for either node, in doctor,
    in --fix, in bootstrap; bootstrap's preflight goes on and the network phase brings the twin Up."""
    lab.exec("spark1", "ip link set enP2p1s0f1np1 down")
    report = found(lab, seed_of(lab, "twin-set-down"))
    assert seen(lab, report) == {("fabric.port_down", "spark1")}
    (f,) = [f for f in report["findings"] if f["id"] == "fabric.port_down"]
    assert "spark2 enP2p1s0f1np1 has no carrier because spark1's end is administratively down" in f["details"]
    assert "cable" not in str([f for f in report["findings"] if f["id"] != "fabric.speed_low"]).lower()
    code, events = bootstrap(lab)
    assert code == 0, failed(events)
    # the lab's 10 Gb/s veths warn "check the cable and the switch port" about their speed, nothing else does
    cables = [e for e in events if "cable" in str(e).lower() and "Gb/s" not in str(e.get("message"))]
    assert cables == []
    preflight = [e for e in events if e.get("task") == "preflight.cluster" and e["event"] == "warning"]
    assert [(e["node"], e["details"]) for e in preflight] == [
        ("spark1", ["spark2 enP2p1s0f1np1 has no carrier because spark1's end is administratively down"])]
    assert changed(events) == {("network.netplan", "spark1")}
    assert doctor(lab)["healthy"]
