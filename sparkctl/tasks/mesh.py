"""Running the mesh proofs of rules/mesh.py on every node at once and turning their verdicts into a failure."""

from __future__ import annotations

from collections.abc import Callable

from sparkctl.rules.mesh import Try, Verdict, missing_verdicts, parse_verdicts
from sparkctl.taskgraph.task import TaskFailed


def collect(outputs: dict[str, tuple[str, str]], tries: dict[str, list[Try]]) -> list[Verdict]:
    """Every try's verdict: outputs is node -> (stdout, why it may be cut short or '')."""
    verdicts: list[Verdict] = []
    for node, node_tries in tries.items():
        stdout, why = outputs.get(node, ("", "the node did not run the check"))
        found = parse_verdicts(node, stdout)
        verdicts += found + missing_verdicts(node, node_tries, found, why or "no verdict printed")
    return verdicts


#: the hint for the broken pairs' own errors (a hint fits the failure it explains)
Hint = Callable[[list[str]], str]


def raise_for(verdicts: list[Verdict], what: str, hint: Hint) -> None:
    """A broken pair fails the task; a pair that could not be checked fails it too, but says so."""
    broken = [v for v in verdicts if v.state == "fail"]
    unknown = [v for v in verdicts if v.state == "unknown"]
    if not broken and not unknown:
        return
    lines = [f"{v.node} -> {v.peer} ({v.target}): {v.error or 'failed'}" for v in broken]
    lines += [f"{v.node} -> {v.peer} ({v.target}): not checked: {v.error}" for v in unknown]
    if broken:
        message = f"{len(broken)} {what}(s) failed"
        if unknown:
            message += f", {len(unknown)} could not be checked"
        raise TaskFailed(message, hint=hint([v.error for v in broken]), details=lines)
    raise TaskFailed(f"{len(unknown)} {what}(s) could not be checked (no pair is known to be broken)",
                     hint="the peers' sshd reset or timed out the handshake (overloaded?); rerun", details=lines)
