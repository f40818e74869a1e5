"""model.fetch: the model and its draft downloaded into the mounted HF cache on every node.

Downloads run inside the container (`hf download`), into the mounted HF cache, so they outlive the container
(cache.py says where); the token comes from the 0600 token file (model.token). With serve.distribute: copy
only the head downloads; model.copy sends the snapshots on to the peers.
"""

from __future__ import annotations

import time

from sparkctl.plan.paths import CONTAINER_HF_HOME
from sparkctl.plan.serve import wanted_repos
from sparkctl.rules.serving import serves
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import DOWNLOAD_TIMEOUT, in_copy_mode_peer, repo_path, snapshot_check_script
from sparkctl.tasks.model.progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.transport.base import CommandResult, q

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


class ModelFetchTask(Task[NodeContext, tuple[str, str | None]]):
    name = "model.fetch"
    phase = "model"
    needs = ("model.fit", "model.token", "container.run")
    description = "download the model and its draft into the mounted HF cache on every node"
    checks = ("the model's hub-cache snapshot (refs/main) and the draft's dir in <hf_cache>/sparkctl-models/ "
              "each hold config.json and every weight file, nothing half-downloaded (no network needed); "
              "with serve.distribute: copy only the head's (model.copy serves the peers); on a rerun read ahead "
              "with the node's facts")
    changes = ("`hf download` inside the container (resumes partial files), with the bytes so far logged every "
               "few seconds; the token comes from the 0600 token file; a gated repo without a token fails with "
               "the license hint")

    def check(self, ctx: NodeContext) -> list[Change[tuple[str, str | None]]]:
        if not serves(ctx.inventory, ctx.name) or in_copy_mode_peer(ctx):
            return []
        repos = wanted_repos(ctx.inventory)
        result = ctx.raise_unless_ok(ctx.read_output(self.name, snapshot_check_script(ctx, repos), timeout=60),
                                     "checking the HF cache")
        changes = []
        for line in result.stdout.splitlines():
            verdict, _, rest = line.partition(" ")
            repo, _, why = rest.partition(" ")
            if verdict == "missing":
                local = dict(repos).get(repo)
                where = local or f"{CONTAINER_HF_HOME}/hub"
                changes.append(Change(f"download {repo} into {where} ({why})", payload=(repo, local)))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[tuple[str, str | None]]]) -> None:
        container = ctx.inventory.container.name
        env = ctx.inventory.serve.hf_token_env
        for change in changes:
            repo, local = change.carried()
            command = f"hf download {q(repo)}" + (f" --local-dir {q(local)}" if local else "")
            measure = directory_size_reader(ctx.transport, repo_path(ctx, repo, local))
            before = measure() or 0
            ctx.log(f"downloading {repo} (resumes what an earlier run left: {human_bytes(before)} there)")
            started = time.monotonic()
            with TransferProgress(ctx.cluster.emit, task=self.name, node=ctx.name, what=repo, measure=measure):
                result = ctx.transport.exec_in(container, command, timeout=DOWNLOAD_TIMEOUT)
            seconds = time.monotonic() - started
            if not result.ok:
                raise _download_failure(ctx.name, repo, result, env)
            size = measure() or 0
            ctx.cluster.emit(Event("log", task=self.name, node=ctx.name, message=(
                f"downloaded {repo}: {human_bytes(size)} in the cache, {human_bytes(size - before)} in "
                f"{seconds:.1f}s, {rate_text(size - before, seconds)}")))


def _download_failure(node: str, repo: str, result: CommandResult, env: str) -> TaskFailed:
    output = (result.stderr or result.stdout).strip()
    tail = output.splitlines()[-3:]
    if is_gated_refusal(output):
        return TaskFailed(f"{repo}{GATED_MARK}{node} has no valid Hugging Face token",
                          hint=gated_hint(repo, env), details=tail)
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
        if outcome.task == ModelFetchTask.name and GATED_MARK in message:
            repo = message.split(GATED_MARK)[0]
            if repo not in repos:
                repos.append(repo)
    return repos
