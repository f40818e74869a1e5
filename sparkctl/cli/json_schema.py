"""The JSON every `--json` prints (and every run journal holds), as models: one object per line, each with the
schema version and its `event`. docs/events.md explains them; docs/events.schema.json is generated from here
(`python -m sparkctl.cli.json_schema > docs/events.schema.json`; a test keeps it in sync) and the tests validate
every command's output against these models.

Objects may carry more keys than listed (a new key does not change the version); the listed ones are promised.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from sparkctl.engines import EngineName
from sparkctl.taskgraph.events import SCHEMA_VERSION

Status = Literal["ok", "changed", "failed", "skipped", "unreachable", "interrupted"]
Severity = Literal["error", "warning", "info"]


class Line(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_version: Literal[1] = Field(alias="schema", description="the version of this schema")
    time: str = Field(description="when, UTC, ISO 8601 with milliseconds")


class ChangeItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    summary: str
    diff: str | None = Field(None, description="unified diff of a file, secrets masked")


# --- a run: bootstrap, cluster down, doctor --fix -------------------------------------------------------------

class RunStart(Line):
    """The first line of a run."""

    event: Literal["run_start"]
    command: str = Field(description="bootstrap, cluster down, doctor --fix")
    cluster: str
    sparkctl: str = Field(description="sparkctl's version")
    nodes: list[str] = Field(description="the nodes the run may change (--limit), in inventory order")
    tasks: int
    check_mode: bool | None = None
    limit: list[str] | None = None
    outside_limit: list[str] | None = Field(None, description="nodes only read (--limit)")
    added_needs: list[str] | None = Field(None, description="tasks run because a task --only named needs them")
    unreachable: dict[str, Literal["network", "auth", "host_key", "lost"]] | None = Field(
        None, description="why each node could not be reached: the network, the login, its host key")


class TaskStart(Line):
    event: Literal["task_start"]
    task: str
    phase: str
    node: str | None = Field(None, description="absent for a cluster-scope task")


class TaskChanges(Line):
    """What a task is about to apply."""

    event: Literal["task_changes"]
    task: str
    phase: str
    node: str | None = None
    changes: list[ChangeItem]


class TaskResult(Line):
    """One task on one node (or the cluster). A node unreachable from the start has task `connect`."""

    event: Literal["task_result"]
    task: str
    phase: str | None = None
    node: str | None = None
    status: Status
    message: str | None = None
    hint: str | None = None
    details: list[str] | None = None
    changes: list[ChangeItem] | None = None
    would_change: bool | None = Field(None, description="--check: the changes were not applied")
    duration: float | None = Field(None, description="seconds; absent when the task did not run")
    reason: Literal["not_selected", "pending", "not_applicable"] | None = Field(
        None, description="skipped: left out by --only/--skip, (--check) cannot know until `pending_on` is "
                          "applied, or nothing to do for this inventory (`message` says why)")
    pending_on: str | None = None
    outside_limit: list[ChangeItem] | None = Field(None, description="changes left alone outside --limit")
    traceback: str | None = None


class Warning(Line):  # noqa: A001 - the event's name
    event: Literal["warning"]
    message: str
    task: str | None = None
    node: str | None = None
    hint: str | None = None
    details: list[str] | None = None


class NodeLost(Line):
    """A node stopped answering mid-run: it leaves the run, the other nodes go on."""

    event: Literal["node_lost"]
    node: str
    task: str | None = Field(None, description="the task that was running when the loss was noticed")
    message: str
    hint: str | None = None


class Interrupt(Line):
    """Ctrl-C: what runs is cut, nothing more starts (the recap follows, exit 130)."""

    event: Literal["interrupt"]
    message: str
    hint: str | None = None


class Log(Line):
    """Progress and facts worth keeping (a download's bytes, the MPI probe, the smoke test's answer)."""

    event: Literal["log"]
    message: str
    task: str | None = None
    node: str | None = None


class Recap(Line):
    """The last line of a run."""

    event: Literal["recap"]
    nodes: dict[str, dict[str, int]] = Field(description="per node (and `(cluster)`): ok, changed, failed, "
                                                         "skipped, unreachable")
    exit_status: int
    duration: float
    check_mode: bool
    verified: bool | None = Field(None, description="the verify phase ran and passed (absent in --check or a "
                                                    "playbook without one)")
    not_verified: str | None = None
    pending: int | None = Field(None, description="--check: results that cannot be known until a need is applied")
    outside_limit: int | None = Field(None, description="changes left alone outside --limit")
    endpoint: str | None = Field(None, description="the OpenAI-compatible endpoint a serving run made")
    smoke: dict[str, Any] | None = Field(None, description="the smoke test: answered, seconds, acceptance length")
    lost: dict[str, dict[str, Any]] | None = Field(
        None, description="per node lost: reason, during (the task), undone (its tasks that never ran)")
    left_undone: list[str] | None = Field(None, description="tasks skipped on the other nodes: they need a lost one")
    interrupted: dict[str, Any] | None = Field(None, description="Ctrl-C: cut (task, node) and not_started tasks")


# --- doctor ---------------------------------------------------------------------------------------------------

class FindingLine(Line):
    """One thing doctor found, on one node (or `(cluster)`)."""

    event: Literal["finding"]
    id: str = Field(description="stable: scripts match on it")
    severity: Severity
    node: str
    summary: str
    phase: str
    evidence: str | None = None
    fix: str | None = None
    details: list[str] | None = None
    diagnosis: Literal["first", "after-fix"] | None = Field(
        None, description="with --fix: the look before the repair, or after it")
    closed_by: dict[str, Any] | None = Field(
        None, description="{tasks: [bootstrap tasks or phases that repair it]} or {person: kind, why}")


class RemedyLine(Line):
    """`doctor --list --json`: one finding id and what closes it."""

    event: Literal["remedy"]
    id: str
    about: str = Field(description="what the finding means")
    closed_by: dict[str, Any] = Field(description="{tasks: [bootstrap tasks or phases that repair it]} or "
                                                  "{person: kind (a key of the report's kinds), why}")


# --- any command ----------------------------------------------------------------------------------------------

class Error(Line):
    """The command could not do its work: the last line, with the exit status (2: bad input, 5: busy...)."""

    event: Literal["error"]
    message: str
    hint: str | None = None
    details: list[str] | None = None
    exit_status: int


class ReportBase(Line):
    """The one line a reporting command prints (the last line of doctor's output)."""

    event: Literal["report"]
    exit_status: int


class Diagnosis(ReportBase):
    report: Literal["doctor"]
    healthy: bool
    nodes: list[str]
    errors: int
    warnings: int
    notes: int
    fix: dict[str, Any] | None = Field(None, description="--fix: the tasks run and what needs a person")
    bundle: dict[str, str] | None = Field(None, description="--bundle: path and sha256")
    cabling: dict[str, Any] | None = Field(None, description="each QSFP port's far end: inferred, lldp_unavailable, "
                                                             "ports")


class RemedyList(ReportBase):
    report: Literal["doctor --list"]
    remedies: int = Field(description="how many `remedy` lines came before")
    kinds: dict[str, str] = Field(description="what a person deals with: kind -> in words")


class StatusNode(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    reachable: bool
    reason: str | None = None
    os: str | None = None
    fabric_ports: dict[str, list[str]] | None = Field(None, description="QSFP port -> twins Up/Down")
    addresses: dict[str, list[str]] | None = None
    container: str | None = None
    hostfile: str | None = None
    listening: dict[str, str] | None = None


class ClusterStatus(ReportBase):
    report: Literal["cluster status"]
    cluster: str
    nodes: list[StatusNode]
    fabric_bench: list[str] | None = Field(None, description="the last fabric bench and what got slower, in words")


class ClusterPlan(ReportBase):
    report: Literal["cluster plan"]
    cluster: str
    phases: list[dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    hostfile: str


class Validation(ReportBase):
    report: Literal["inventory validate"]
    file: str
    cluster: str
    nodes: list[str]
    topology: str
    head: str
    tp_size: int
    warnings: list[str]


class ServeStatus(ReportBase):
    report: Literal["serve status"]
    healthy: bool
    rows: dict[str, Any]


class ServeStop(ReportBase):
    report: Literal["serve stop"]
    stopped_pid: int | None
    leftovers: list[str]
    unreachable: dict[str, str]


class ServeBench(ReportBase):
    report: Literal["serve bench"]
    time: str = Field(description="when the bench ran (UTC, ISO 8601)")
    endpoint: str
    model: str = Field(description="the repo id of the model measured")
    name: str = Field(description="the name it was asked by (--model; by default the first model's)")
    engine: EngineName
    max_tokens: int
    levels: list[dict[str, Any]] = Field(description="per concurrency: requests, failed, seconds, completion_tokens, "
                                                     "decode_tps_per_request, aggregate_tps, ttft_p50, ttft_p95 "
                                                     "(seconds), acceptance_length")
    output: str | None = Field(description="the file -o wrote the same results to ('-': stdout); null: none asked")
    recorded: str = Field(description="the record kept with the cluster's others "
                                      "($XDG_STATE_HOME/sparkctl/serve-bench/<cluster>/<UTC time>.json)")


class Presets(ReportBase):
    report: Literal["serve presets"]
    presets: list[dict[str, Any]]


class Playbooks(ReportBase):
    report: Literal["playbooks"]
    playbooks: dict[str, Any]


class InventoryInit(ReportBase):
    report: Literal["inventory init"]
    output: str
    assumptions: list[str]
    seen_with_lldp: list[str] | None = None


class LabStatus(ReportBase):
    report: Literal["lab status"]
    lab: str
    topology: str
    port: int
    ring_order: list[int] | None = None
    renderer: str | None = None
    phase: str
    nodes: list[dict[str, Any]]


class FabricBench(ReportBase):
    report: Literal["fabric bench"]
    links: list[dict[str, Any]] = Field(description="per link and twin: the figures and the verdict")
    nccl: dict[str, Any] | None = Field(None, description="the all-reduce: bus bandwidth, transport per rank, verdict")
    unreachable: dict[str, str]
    recorded: str | None = None


Report = Annotated[Diagnosis | RemedyList | ClusterStatus | ClusterPlan | Validation | ServeStatus | ServeStop |
                   ServeBench | Presets | Playbooks | InventoryInit | LabStatus | FabricBench,
                   Field(discriminator="report")]
# --- sparkctl top --json: one per refresh ------------------------------------------------------------------------

class TopLink(BaseModel):
    model_config = ConfigDict(extra="allow")

    interface: str
    role: Literal["fabric", "management"]
    counters: Literal["rdma", "netdev"] = Field(description="the RoCE port's counters (RDMA included), or the "
                                                            "netdev's")
    rx_gbps: float | None = Field(description="since the last refresh; null on the first")
    tx_gbps: float | None
    errors: int | None = Field(description="receive and transmit errors since the last refresh")
    drops: int | None
    nccl: bool = Field(description="the serving world's NCCL lines name this twin")


class TopNode(BaseModel):
    model_config = ConfigDict(extra="allow")

    answering: bool
    why: str = Field("", description="why the node is not answering")
    gpu_util_pct: float | None = None
    gpu_mem_used_mib: float | None = Field(None, description="null on a Spark: unified memory (memory_*)")
    gpu_mem_total_mib: float | None = None
    gpu_temp_c: float | None = None
    gpu_power_w: float | None = None
    cpu_pct: float | None = None
    mem_used_gib: float | None = None
    mem_total_gib: float | None = None
    container: str = Field("unknown", description="docker's state of the cluster's container: running, exited, "
                                                  "absent ...")
    links: list[TopLink] = []


class TopServing(BaseModel):
    model_config = ConfigDict(extra="allow")

    engine: EngineName
    metrics_status: int = Field(description="the HTTP status of /metrics through the gateway; 0: no answer")
    running: float | None = None
    waiting: float | None = None
    prompt_tps: float | None = None
    generation_tps: float | None = None
    ttft_p50_s: float | None = Field(None, description="vLLM and SGLang (TensorRT-LLM's iteration stats have no "
                                                       "TTFT)")
    kv_cache_fraction: float | None = None
    acceptance: float | None = Field(None, description="accepted / drafted tokens since the last refresh")
    generated_tokens: float | None = Field(None, description=(
        "tokens generated since the engine started (TensorRT-LLM: since the head's figures collector started), the "
        "counter every reader of /metrics through the gateway shares"))


class TopWorld(TopServing):
    model: str = Field(description="the model's name clients ask for, `#<n>` after it for a replica of several")


class Top(Line):
    """One refresh of `sparkctl top --json`."""

    event: Literal["top"]
    cluster: str
    seconds: float = Field(description="since the refresh before")
    nodes: dict[str, TopNode]
    serving: TopServing | None = Field(description="null when the inventory does not serve; with several worlds, the "
                                                    "first's")
    worlds: list[TopWorld] | None = Field(None, description="with several worlds only: each world's figures, in the "
                                                            "order of serve.models (the first's through the gateway, "
                                                            "the others' from their engine on their head)")


AnyLine = Annotated[RunStart | TaskStart | TaskChanges | TaskResult | Warning | NodeLost | Interrupt | Log | Recap |
                    FindingLine | RemedyLine | Error | Top | Report, Field(discriminator="event")]

_ADAPTER: TypeAdapter = TypeAdapter(AnyLine)


def validate_line(data: dict[str, Any]) -> BaseModel:
    """Raises pydantic.ValidationError when a line breaks the schema."""
    return _ADAPTER.validate_python(data)


def events_json_schema() -> dict[str, Any]:
    schema = _ADAPTER.json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = f"sparkctl --json output, schema version {SCHEMA_VERSION} (one object per line)"
    return schema


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps(events_json_schema(), indent=2, sort_keys=True))
