"""A chaos soak on a lab pair: a seeded random sequence of the lab's seeded faults (tests/lab/seeds_kit.py), one or
two at a time, each round closed the way a user would: `doctor --fix` or a bootstrap rerun for what sparkctl
repairs, the person's own step (once doctor has named it) for what it cannot. Every round's outcome is logged; a
round that does not close keeps the evidence a person would want (each node's addresses, links, routes, listening
sockets, sshd's state and configuration, the ssh journal, the netplan files, the containers) in --keep.

Run as root: `python benchmarks/soak.py [--seeds 1,2,3] [--rounds 40] [--keep DIR]`. One lab pair is brought up and
bootstrapped; every seed's sequence runs on it in turn; it is torn down at the end.

After every round, each node's management path is checked the way the controller uses it (ssh to its management
address with the lab's key, `true`), so a round that takes it is caught in that round, with the evidence read over
the node's own namespace (`lab exec`), which needs no network.

A round closes when, after the closing step: doctor finds no error and none of the round's seeded findings (nor a
warning beyond the healthy lab's own), a bootstrap rerun changes nothing, and both management paths answer.
Printed, never asserted: the table (rounds, closed, how, seconds per round, seeds) goes to docs/soak.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.lab.doctor_kit import Seed, bootstrap, changed, doctor, failed, problems  # noqa: E402
from tests.lab.seeds_kit import Fault, faults, seeds, system_faults  # noqa: E402

#: What each fault touches: two faults of one round never touch the same thing (a container removed hides its
#: mesh; both twins down hide the ssh mesh), so each round's outcome is about its own faults.
TOUCHES = {
    "twin-set-down": "links", "both-twins-set-down": "links", "mtu": "links", "link-local": "addresses",
    "address-extra": "addresses", "twins-one-subnet": "addresses", "address-missing": "addresses",
    "address-foreign": "addresses", "address-duplicate": "addresses", "netplan-conflict": "netplan",
    "netplan-drift": "netplan", "ssh-mesh": "ssh", "container-exited": "container", "container-missing": "container",
    "container-spec-drift": "container", "container-restarting": "container", "container-ssh": "container",
    "container-exposed": "container", "env-absent": "container", "env-down": "container",
    "env-management": "container", "env-unset": "container", "ib-hca-missing": "container",
    "ib-hca-partial": "container", "hostfile": "container",
    # a person's
    "port-taken": "container", "docker-group": "account", "sudo-password": "account", "ssh-auth": "ssh",
    "hf-cache-full": "disk", "gid-missing": "standin", "roce-port-inactive": "standin",
    "firmware-differs": "standin", "driver-differs": "standin", "driver-too-old": "standin",
    "nccl-conf": "container", "bashrc": "shell", "sshd-dropin": "ssh",
}
#: A seeded finding another fault of the round rightly hides: doctor names the root cause (a link or an address
#: broken), not the logins across it that it breaks (doctor/checks/ssh.py, `link_broken`).
HIDDEN_BY = {"ssh.mesh_broken": {"links", "addresses"}, "container.ssh_broken": {"links", "addresses"}}
#: Faults that keep the controller out of their node: doctor reads nothing else there until a person lets it in.
LOCKS_OUT = {"ssh-auth"}
#: Read on a node (through its namespace, not the network) when a round does not close.
EVIDENCE = [
    "ip -br link", "ip -br addr", "ip route", "ss -ltnp", "systemctl is-active ssh NetworkManager systemd-networkd",
    "journalctl -u ssh --no-pager -n 40", "ls -l /etc/netplan; head -50 /etc/netplan/*.yaml",
    "ls /etc/ssh/sshd_config.d; cat /etc/ssh/sshd_config.d/*.conf", "cat /home/nvidia/.ssh/authorized_keys",
    "nmcli -t device 2>/dev/null", "networkctl list --no-pager 2>/dev/null", "docker ps -a",
    "cat /run/lab/standin-faults",
]


@dataclass
class Round:
    seed: int
    number: int
    faults: list[str]
    closer: str
    found: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)
    #: seeded findings another fault of the round hid (HIDDEN_BY): not a miss
    hidden: list[str] = field(default_factory=list)
    outcome: str = ""
    attempts: int = 0
    seconds: float = 0.0
    left: list[str] = field(default_factory=list)
    #: what the first closing step left, when a second was needed
    first_left: list[str] = field(default_factory=list)
    evidence: str = ""

    @property
    def closed(self) -> bool:
        return self.outcome == "closed"


def management_paths(lab) -> dict[str, str]:
    """Per node that does not answer over its management address (ssh as the controller does), why."""
    out = {}
    for record in lab.state.nodes:
        try:
            proc = subprocess.run(lab.ssh_argv(record.name, "true"), capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            out[record.name] = "ssh timed out after 20 s"
            continue
        if proc.returncode != 0:
            out[record.name] = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return out


def keep_evidence(lab, keep: Path, name: str, why: str) -> str:
    keep.mkdir(parents=True, exist_ok=True)
    path = keep / f"{name}.txt"
    with path.open("w") as out:
        out.write(f"{why}\n")
        for record in lab.state.nodes:
            for command in EVIDENCE:
                result = lab.exec(record.name, ["sh", "-c", command], timeout=30)
                out.write(f"\n### {record.name}: {command}\n{result.stdout}{result.stderr}")
    return str(path)


def pick(rng: random.Random, catalogue: dict[str, Seed | Fault]) -> list[str]:
    names = sorted(catalogue)
    first = rng.choice(names)
    if rng.random() < 0.5:
        return [first]
    others = [n for n in names if TOUCHES[n] != TOUCHES[first]]
    return [first, rng.choice(others)]


def seeded_finding(item: Seed | Fault) -> tuple[str, str]:
    return (item.finding, item.node) if isinstance(item, Seed) else (item.expect, item.node)


def seed_fault(lab, item: Seed | Fault) -> None:
    if isinstance(item, Seed):
        item.seed(lab)
        return
    result = lab.exec(item.node, item.seed)
    if result.returncode != 0:
        raise RuntimeError(f"seeding {item.name} failed: {result.stderr.strip()[:200]}")


def look(lab, wanted: set[tuple[str, str]], baseline: set, timeout: float = 60) -> dict:
    """doctor until every seeded finding shows (networkd drops an address a moment after the carrier) or timeout."""
    deadline = time.monotonic() + timeout
    while True:
        report = doctor(lab)
        seen = problems(report) | {(f["id"], f["node"]) for f in report["findings"]}
        if wanted <= seen or time.monotonic() > deadline:
            return report
        time.sleep(1)


def close(lab, closer: str) -> list[str]:
    """Run the closing step; what it said failed or left to a person."""
    if closer == "doctor --fix":
        fix = doctor(lab, "--fix").get("fix", {})
        said = [f"--fix left {f['id']} on {f['node']}" for f in fix.get("needs_you", [])]
        return said + ([f"--fix's run exited {fix['exit_status']}"] if fix.get("exit_status") else [])
    code, events = bootstrap(lab)
    return [f"bootstrap exit {code}: {line}" for line in failed(events)] if code else []


def settled(lab, seeded: set[tuple[str, str]], baseline: set) -> list[str]:
    """What is still wrong after a closing step: errors, the seeded findings, new warnings, a rerun that changes
    something, a management path that does not answer."""
    report = doctor(lab)
    left = [f"{i} on {n}" for i, n in sorted((problems(report) - baseline) | (seeded & problems(report)))]
    left += [f"error {i} on {n}" for i, n in sorted({(f["id"], f["node"]) for f in report["findings"]
                                                      if f["severity"] == "error"}) if f"{i} on {n}" not in left]
    if not left:
        code, events = bootstrap(lab)
        if code != 0 or changed(events):
            left.append(f"the rerun after it: exit {code}, changed {sorted(changed(events))}, {failed(events)}")
    left += [f"{node}'s management path: {why}" for node, why in management_paths(lab).items()]
    return left


def run_round(lab, rng: random.Random, seed: int, number: int, catalogue: dict[str, Seed | Fault],
              baseline: set, keep: Path) -> Round:
    names = pick(rng, catalogue)
    closer = rng.choice(["doctor --fix", "bootstrap"])
    result = Round(seed, number, names, closer)
    started = time.monotonic()
    items = [catalogue[n] for n in names]
    for item in items:
        seed_fault(lab, item)
    wanted = {seeded_finding(i) for i in items if not (isinstance(i, Fault) and i.warning)}
    report = look(lab, wanted, baseline)
    seen = {(f["id"], f["node"]) for f in report["findings"]}
    result.found = sorted(f"{i} on {n}" for i, n in wanted & seen)
    for item in items:
        if seeded_finding(item) in wanted - seen:
            others = {TOUCHES[other.name] for other in items if other is not item}
            locked_out = any(o.name in LOCKS_OUT and o.node == item.node for o in items if o is not item)
            hidden = (HIDDEN_BY.get(seeded_finding(item)[0], set()) & others) or locked_out
            (result.hidden if hidden else result.missed).append("{} on {}".format(*seeded_finding(item)))
    # a person's step, once doctor has named it (a warning's too: the person reads the report)
    for item in items:
        if isinstance(item, Fault):
            done = lab.exec(item.node, ["sh", "-c", item.manual], timeout=120)
            if done.returncode != 0:
                result.left.append(f"the person's step for {item.name} failed: {done.stderr.strip()[:200]}")
    for attempt, how in enumerate([closer, "bootstrap" if closer != "bootstrap" else "doctor --fix"], start=1):
        said = close(lab, how)
        result.attempts = attempt
        result.left = settled(lab, {seeded_finding(i) for i in items}, baseline)
        if not result.left:
            break
        if attempt == 1:
            result.first_left = [*said, *result.left]
    result.seconds = time.monotonic() - started
    result.outcome = "closed" if not result.left and not result.missed else (
        "not found" if result.missed and not result.left else "not closed")
    if not result.closed:
        result.evidence = keep_evidence(lab, keep, f"seed{seed}-round{number:02d}",
                                        f"faults {names}; closer {closer}; left {result.left}; missed {result.missed}")
        close(lab, "bootstrap")  # the next round starts from a converged lab when it can
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--keep", default=None, help="where rounds that do not close keep their evidence")
    args = parser.parse_args()
    from sparkctl.lab.image import ensure_image
    from sparkctl.lab.lab import Lab

    ensure_image()
    keep = Path(args.keep or tempfile.mkdtemp(prefix="soak-evidence-"))
    log = keep / "rounds.jsonl"
    keep.mkdir(parents=True, exist_ok=True)
    rows: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        lab = Lab.up(Path(directory) / "lab", nodes=2, topology="pair")
        try:
            code, events = bootstrap(lab)
            if code != 0:
                raise SystemExit(f"the lab did not bootstrap: {failed(events)}")
            baseline = problems(doctor(lab))
            for seed in (int(s) for s in args.seeds.split(",")):
                rng = random.Random(seed)
                catalogue: dict[str, Seed | Fault] = {s.name: s for s in seeds(cluster_of(lab))}
                catalogue.update({f.name: f for f in [*faults(), *system_faults()]})
                for number in range(1, args.rounds + 1):
                    row = run_round(lab, rng, seed, number, catalogue, baseline, keep)
                    rows.append(row)
                    with log.open("a") as out:
                        out.write(json.dumps(row.__dict__) + "\n")
                    print(f"seed {seed} round {number:2d}: {row.outcome:<10} {row.seconds:5.1f} s  "
                          f"{'+'.join(row.faults):<40} {row.closer:<13} attempts {row.attempts}"
                          + (f"  left: {row.left} missed: {row.missed} evidence: {row.evidence}"
                             if not row.closed else "")
                          + (f"  first try left: {row.first_left}" if row.first_left else ""), flush=True)
        finally:
            lab.down()
    print_table(rows, log)


def cluster_of(lab) -> str:
    import yaml

    return yaml.safe_load(Path(lab.inventory_path).read_text())["cluster"]["name"]


def print_table(rows: list[Round], log: Path) -> None:
    print()
    print(f"{'seed':>4} {'rounds':>6} {'closed':>6} {'1st try':>7} {'2nd try':>7} {'2 faults':>8} "
          f"{'person':>6} {'median s':>8} {'max s':>6}")
    for seed in dict.fromkeys(r.seed for r in rows):
        mine = [r for r in rows if r.seed == seed]
        closed = [r for r in mine if r.closed]
        print(f"{seed:>4} {len(mine):>6} {len(closed):>6} {sum(r.attempts == 1 for r in closed):>7} "
              f"{sum(r.attempts == 2 for r in closed):>7} {sum(len(r.faults) == 2 for r in mine):>8} "
              f"{sum(any(f in PERSON for f in r.faults) for r in mine):>6} "
              f"{statistics.median(r.seconds for r in mine):>8.1f} {max(r.seconds for r in mine):>6.1f}")
    for r in rows:
        if not r.closed:
            print(f"  seed {r.seed} round {r.number}: {r.outcome}: {'+'.join(r.faults)}; left {r.left}; "
                  f"missed {r.missed}; evidence {r.evidence}")
        elif r.first_left:
            print(f"  seed {r.seed} round {r.number}: closed by a second step ({'+'.join(r.faults)}, first "
                  f"{r.closer}): the first left {r.first_left}")
    print(f"every round: {log}")


PERSON = {f.name for f in [*faults(), *system_faults()]}


if __name__ == "__main__":
    main()
