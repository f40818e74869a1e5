"""`sparkctl doctor` end to end: connect, read facts once per node, plan, probe (one round trip per node), check;
with --fix, run the bootstrap tasks that own the errors and look again; with --bundle, write the support bundle.
Everything it finds is journaled."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkctl.doctor.bundle import bundle_bytes, write_bundle
from sparkctl.doctor.diagnose import run_checks
from sparkctl.doctor.findings import Diagnosis, Finding
from sparkctl.doctor.fix import repair_selection
from sparkctl.doctor.probes import run_probes
from sparkctl.doctor.snapshot import Snapshot, doctor_plan
from sparkctl.errors import SparkctlError
from sparkctl.inventory import Inventory
from sparkctl.inventory.tls_files import TlsUnreadable, tls_files
from sparkctl.runs.bench_records import bench_history
from sparkctl.runs.journal import Journal, latest_runs
from sparkctl.runs.outputs import check_writable
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.proofs import ProofFile
from sparkctl.runs.session import RunRequest, Session, run_playbook
from sparkctl.runs.status import holder_now
from sparkctl.secrets import SecretUnreadable, secret_from_env
from sparkctl.taskgraph import Event, RunResult
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.tasks.container.proofs import CONTAINER_MESH
from sparkctl.tasks.context import ProofRecords, RunOptions
from sparkctl.tasks.proof import PairProofs, pair_id
from sparkctl.tasks.ssh.proofs import HOST_MESH

#: --bundle -: the tar.gz goes to stdout.
STDOUT = "-"
#: Run journals a support bundle carries, newest first.
BUNDLE_JOURNALS = 5


@dataclass
class DoctorRequest:
    limit: set[str] | None = None
    forks: int = DEFAULT_FORKS
    become_password: str | None = None
    #: run the owning bootstrap tasks for the errors found, then look again
    fix: bool = False
    #: write a support bundle here (the containers' logs are read for it too)
    bundle: str | None = None


@dataclass
class Repair:
    ran: set[str]
    result: RunResult | None
    needs_you: list[Finding] = field(default_factory=list)


@dataclass
class DoctorOutcome:
    diagnosis: Diagnosis
    snapshot: Snapshot
    repair: Repair | None = None
    bundle_sha256: str | None = None
    #: --bundle -: the tar.gz, for the command to write to stdout
    bundle_bytes: bytes | None = None


def take_snapshot(inventory: Inventory, request: DoctorRequest) -> Snapshot:
    """One look at the cluster: facts and plan of every reachable node, the probes of those diagnosed (--limit
    reads every node's facts all the same: the plan is the whole cluster's)."""
    with Session(inventory, limit=request.limit, forks=request.forks,
                 become_password=request.become_password) as session:
        facts = session.gather()
        plan, plan_error = doctor_plan(inventory, facts)
        diagnosed = set(session.limited)
        probes = run_probes({n: t for n, t in session.transports.items() if n in facts and n in diagnosed},
                            inventory, plan, facts, want_logs=bool(request.bundle), forks=request.forks)
        busy = holder_now(inventory, session)
        unreachable = dict(session.unreachable)
        kinds = dict(session.unreachable_kinds)
    for node, probe in probes.items():
        if probe.lost:
            unreachable[node] = probe.error or "it stopped answering"  # powered off between the facts and the probes
            kinds[node] = "lost"
            facts.pop(node, None)
    order = [n.name for n in inventory.nodes]
    return Snapshot(inventory, {n: facts[n] for n in order if n in facts},
                    {n: unreachable[n] for n in order if n in unreachable}, probes, plan, plan_error,
                    become_password_given=bool(request.become_password),
                    bench_history=bench_history(inventory.cluster.name),
                    limit=frozenset(request.limit) if request.limit else None,
                    unreachable_kinds={n: kinds[n] for n in unreachable if n in kinds}, busy=busy,
                    tls_certificate=tls_certificate(inventory))


def tls_certificate(inventory: Inventory) -> str | None:
    """serve.tls's certificate as this machine has it now (what the gateway should serve)."""
    tls = inventory.serve.tls
    if tls is None:
        return None
    try:
        return tls_files(tls).certificates
    except TlsUnreadable:
        return None


def diagnose(inventory: Inventory, request: DoctorRequest | None = None) -> tuple[Diagnosis, Snapshot]:
    snapshot = take_snapshot(inventory, request or DoctorRequest())
    forget_broken_pairs(snapshot, ProofFile(inventory.cluster.name))
    return run_checks(snapshot), snapshot


def forget_broken_pairs(snapshot: Snapshot, records: ProofRecords) -> None:
    """Doctor proves every pair of both meshes: one it did not find ok leaves the record, so the next bootstrap
    tries it whatever its fingerprint says (something the fingerprint does not cover may have broken it)."""
    for key, of in ((HOST_MESH, lambda p: p.ssh), (CONTAINER_MESH, lambda p: p.container_ssh)):
        broken = [pair_id(node, t.peer, t.target) for node, probe in snapshot.probes.items()
                  for t in of(probe) if not t.ok]
        if broken:
            PairProofs(records, key).forget(broken)


def repair(inventory: Inventory, diagnosis: Diagnosis, request: DoctorRequest, emit: Callable[[Event], None]) -> Repair:
    """Run the bootstrap tasks owning the errors (the same idempotent tasks as bootstrap)."""
    graph = bootstrap_graph()
    only, manual = repair_selection(diagnosis, graph)
    if not only:
        return Repair(only, None, manual)
    run = RunRequest(options=RunOptions(become_password=request.become_password), limit=request.limit, only=only,
                     forks=request.forks)
    return Repair(only, run_playbook(inventory, graph, run, emit, command="doctor --fix"), manual)


def run_doctor(inventory: Inventory, request: DoctorRequest, *, before_repair: Callable[[Diagnosis], None],
               repair_emit: Callable[[Event], None]) -> DoctorOutcome:
    """The whole command. `before_repair` shows the first diagnosis when a repair follows; `repair_emit` gets
    the repair run's events (the journal gets them too)."""
    if request.bundle and request.bundle != STDOUT:
        check_writable(request.bundle, "--bundle")
    # the token is read only so that redaction knows it (bundle, journal, output); an unreadable token file is
    # a finding of the nodes' (no token there), not a reason to stop
    with contextlib.suppress(SecretUnreadable):
        secret_from_env(inventory.serve.hf_token_env)
    with Journal(command="doctor", cluster=inventory.cluster.name) as journal:
        diagnosis, snapshot = diagnose(inventory, request)
        _journal(diagnosis, journal, "first")
        outcome = DoctorOutcome(diagnosis, snapshot)
        if request.fix and (not diagnosis.healthy or repair_selection(diagnosis, bootstrap_graph())[0]):
            before_repair(diagnosis)
            def emit(event: Event) -> None:
                journal(event)
                repair_emit(event)

            outcome.repair = repair(inventory, diagnosis, request, emit)
            outcome.diagnosis, outcome.snapshot = diagnose(inventory, request)
            _journal(outcome.diagnosis, journal, "after-fix")
    if request.bundle == STDOUT:
        outcome.bundle_bytes = bundle_bytes(outcome.diagnosis, outcome.snapshot,
                                            latest_runs(BUNDLE_JOURNALS, cluster=inventory.cluster.name))
        outcome.bundle_sha256 = hashlib.sha256(outcome.bundle_bytes).hexdigest()
    elif request.bundle:
        try:
            outcome.bundle_sha256 = write_bundle(request.bundle, outcome.diagnosis, outcome.snapshot,
                                                 latest_runs(BUNDLE_JOURNALS, cluster=inventory.cluster.name))
        except OSError as exc:
            raise SparkctlError(f"cannot write the bundle {request.bundle}: {exc.strerror or exc}") from exc
    return outcome


def finding_event(f: Finding, label: str | None = None) -> Event:
    """A finding as the event `doctor --json` prints and the journal keeps (docs/events.md)."""
    data = {k: v for k, v in f.to_dict().items() if k not in ("node", "phase", "details")}
    if label:
        data["diagnosis"] = label
    return Event("finding", node=f.node, phase=f.phase, details=list(f.details), data=data)


def _journal(diagnosis: Diagnosis, journal: Journal, label: str) -> None:
    for f in diagnosis.findings:
        journal(finding_event(f, label))
