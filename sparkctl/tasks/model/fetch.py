"""model.fetch: the model and its draft downloaded into the mounted HF cache on every node.

Downloads run inside the container (`hf download`), into the mounted HF cache, so they outlive the container
(cache.py says where); the token comes from the 0600 token file (model.token). With serve.distribute: copy
only the head downloads; model.copy sends the snapshots on to the peers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sparkctl.plan.paths import CONTAINER_HF_HOME
from sparkctl.plan.revisions import repo_folder
from sparkctl.plan.serve import node_repos
from sparkctl.rules.serving import serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import (
    DOWNLOAD_TIMEOUT,
    in_copy_mode_peer,
    parse_snapshot_check,
    repo_path,
    snapshot_check_script,
)
from sparkctl.tasks.model.progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.transport.base import CommandResult, q

#: The Hub is asked online by sparkctl's own downloads only: the container runs offline (plan/container.py).
ONLINE = {"HF_HUB_OFFLINE": "0"}
#: model.pin resolves a revision with `hf download` too: a gated repo without a token stops it first
PIN_TASK = "model.pin"

#: In the failure message of a download refused for lack of a token (a run offers a prompt on it).
GATED_MARK = " is a gated repo and "


def is_gated_refusal(output: str) -> bool:
    """huggingface_hub's gated-repo refusal: GatedRepoError / "Cannot access gated repo" before 1.4; from 1.4 on
    "Access denied ... requires approval" (the wording issue 14 quotes; not checked against huggingface_hub's
    source here)."""
    return ("GatedRepoError" in output or "Cannot access gated repo" in output
            or ("Access denied" in output and "requires approval" in output))


def gated_hint(repo: str, env: str) -> str:
    return (f"accept the license at https://huggingface.co/{repo} with your account, then export {env}=<your "
            f"token> (serve.hf_token_env names the variable) and rerun; sparkctl puts it on each node as a 0600 "
            f"file")


@dataclass(frozen=True)
class FetchStep:
    repo: str
    local: str | None  # the --local-dir in the container, None for the hub cache
    pin: str | None    # the commit model.pin chose (None: the node has no pin, main is downloaded)
    download: bool     # False: the snapshot is whole, only refs/main is moved to the pin


class ModelFetchTask(Task[NodeContext, FetchStep]):
    name = "model.fetch"
    phase = "model"
    needs = ("model.fit", "model.token", "container.run", "model.pin")
    description = "download the pinned commit of the model and its draft into the mounted HF cache on every node"
    checks = ("the model's hub-cache snapshot of the node's pin (model.pin; without one refs/main's) and the draft's "
              "dir in <hf_cache>/sparkctl-models/ (downloaded from the pinned commit) each hold config.json and every "
              "weight file, nothing half-downloaded (no network needed); refs/main is the pin (the engines, offline, "
              "find the model through it); with serve.distribute: copy only the head's (model.copy serves the "
              "peers); on a rerun read ahead with the node's facts")
    changes = ("`hf download --revision <pin>` inside the container (resumes partial files), with the bytes so far "
               "logged every few seconds, then refs/main set to the pin; the token comes from the 0600 token file; "
               "a gated repo without a token fails with the license hint")

    def check(self, ctx: NodeContext) -> list[Change[FetchStep]]:
        if not serves(ctx.inventory, ctx.name) or in_copy_mode_peer(ctx):
            return []
        repos = node_repos(ctx.inventory, ctx.name)
        result = ctx.raise_unless_ok(ctx.read_output(self.name, snapshot_check_script(ctx, repos), timeout=60),
                                     "checking the HF cache")
        changes = []
        for verdict, repo, pin, why in parse_snapshot_check(result.stdout):
            local = dict(repos).get(repo)
            at = f"@{pin[:12]}" if pin else ""
            if verdict == "missing":
                where = local or f"{CONTAINER_HF_HOME}/hub"
                changes.append(Change(f"download {repo}{at} into {where} ({why})",
                                      payload=FetchStep(repo, local, pin, True)))
            elif verdict == "repoint" and pin:
                changes.append(Change(f"point {repo}'s refs/main at the pinned {pin[:12]} (the snapshot is whole)",
                                      payload=FetchStep(repo, local, pin, False)))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[FetchStep]]) -> None:
        container = ctx.inventory.container.name
        env = ctx.inventory.serve.hf_token_env
        for change in changes:
            step = change.carried()
            if step.download:
                self._download(ctx, step, env)
            if step.pin and step.local is None:
                refs = f"{CONTAINER_HF_HOME}/hub/{repo_folder(step.repo)}/refs"
                # as the container's root, like the download that wrote the cache
                ctx.raise_unless_ok(ctx.transport.exec_in(container, (
                    f"mkdir -p {q(refs)} && printf %s {q(step.pin)} > {q(refs)}/main.sparkctl && "
                    f"mv -f {q(refs)}/main.sparkctl {q(refs)}/main"), timeout=60), f"pointing {step.repo} at its pin")
        ctx.invalidate()

    def _download(self, ctx: NodeContext, step: FetchStep, env: str) -> None:
        repo, local = step.repo, step.local
        command = f"hf download {q(repo)}" + (f" --revision {q(step.pin)}" if step.pin else "") + \
            (f" --local-dir {q(local)}" if local else "")
        measure = directory_size_reader(ctx.transport, repo_path(ctx, repo, local))
        before = measure() or 0
        ctx.log(f"downloading {repo} (resumes what an earlier run left: {human_bytes(before)} there)")
        started = time.monotonic()
        with TransferProgress(ctx.cluster.emit, task=self.name, node=ctx.name, what=repo, measure=measure):
            result = ctx.transport.exec_in(ctx.inventory.container.name, command, timeout=DOWNLOAD_TIMEOUT,
                                           env=ONLINE)
        seconds = time.monotonic() - started
        if not result.ok:
            raise download_failure(ctx.name, repo, result, env, asked=step.pin)
        size = measure() or 0
        ctx.cluster.emit(Event("log", task=self.name, node=ctx.name, message=(
            f"downloaded {repo}: {human_bytes(size)} in the cache, {human_bytes(size - before)} in "
            f"{seconds:.1f}s, {rate_text(size - before, seconds)}")))


def download_failure(node: str, repo: str, result: CommandResult, env: str, asked: str | None = None) -> TaskFailed:
    output = (result.stderr or result.stdout).strip()
    tail = output.splitlines()[-3:]
    if is_gated_refusal(output):
        return TaskFailed(f"{repo}{GATED_MARK}{node} has no valid Hugging Face token",
                          hint=gated_hint(repo, env), details=tail)
    if "RevisionNotFoundError" in output:
        return TaskFailed(f"{repo} has no revision {asked or 'main'} on the Hub",
                          hint="check serve.revision in the inventory (a branch, a tag or a commit of the repo)",
                          details=tail)
    if "RepositoryNotFoundError" in output:
        return TaskFailed(f"{repo} was not found on the Hub (or it is private and the token cannot see it)",
                          hint=f"check the repo name in the inventory; for a private repo export {env}",
                          details=tail)
    if "command not found" in output or result.exit_code == 127:
        return TaskFailed(f"`hf` is not in the container on {node}",
                          hint="use a TensorRT-LLM image with huggingface_hub's CLI", details=tail)
    reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
    return TaskFailed(f"downloading {repo} on {node} failed ({reason})",
                      hint="a rerun resumes the partial download", details=tail)


def gated_repos_failed(outcomes) -> list[str]:
    """The repos whose download failed for lack of a token, from a run's task outcomes."""
    repos = []
    for outcome in outcomes:
        message = outcome.message or ""
        if outcome.task in (ModelFetchTask.name, PIN_TASK) and GATED_MARK in message:
            repo = message.split(GATED_MARK)[0]
            if repo not in repos:
                repos.append(repo)
    return repos
