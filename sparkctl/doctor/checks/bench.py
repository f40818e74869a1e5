"""PURE: the fabric's recorded bandwidth against itself — the last `fabric bench` slower than the first recorded
bench or the one before it that measured the same figure the same way, on a link or in the NCCL all-reduce."""

from __future__ import annotations

import shlex

from sparkctl.doctor.catalog import FABRIC_BANDWIDTH_REGRESSION
from sparkctl.doctor.findings import Finding, Phase, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.bench_history import REGRESSION_FRACTION, regressions

PHASE: Phase = "verify"


def check_bandwidth_regression(s: Snapshot) -> list[Finding]:
    out = []
    inventory = shlex.quote(str(s.inventory.source or "inventory.yaml"))
    history = s.bench_history
    for found in regressions(history):
        node = found.node if found.node in s.all_nodes else s.all_nodes[0]
        now = history[0].get("time", "?")
        out.append(finding(FABRIC_BANDWIDTH_REGRESSION,
            node,
            f"{found.subject} is {found.percent_lower}% slower than at the {found.reference} ({found.then_time})",
            evidence=(f"{found.now:.3g} {found.unit} in the bench of {now}, {found.then:.3g} {found.unit} in that of "
                      f"{found.then_time}, both measured alike ({found.how}); a drop of more than "
                      f"{round(REGRESSION_FRACTION * 100)}% counts"
                      + (f"; the bench said: {found.now_summary}" if found.now_summary else "")),
            fix=(f"a person must find what changed on this link (the bench's causes name the evidence: link speed, "
                 f"MTU, NCCL_IB_HCA, PCIe width, a shaper); after fixing it, `sparkctl fabric bench {inventory}` "
                 "records the new figures")))
    return out


CHECKS = [check_bandwidth_regression]
