"""model.fit, model.token, model.fetch (+ model.copy): will it fit, the HF token as a 0600 file, the snapshots.

Downloads run inside the container (`hf download`), into the mounted HF cache, so they outlive the container
(model_cache.py says where). huggingface_hub reads the token from `$HF_HOME/token`: the token never appears on
a command line, in the environment of `docker exec`, a log or an event. With serve.distribute: copy only the
head downloads (and holds the token); model.copy (model_copy.py) sends the snapshots on to the peers.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from sparkctl.engine.events import Event
from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.fitcheck import fit_verdict, refusal_hint
from sparkctl.plan.container import CONTAINER_HF_HOME
from sparkctl.secrets import register_secret
from sparkctl.tasks.model_cache import (
    DOWNLOAD_TIMEOUT,
    host_path,
    repo_path,
    serving_enabled,
    snapshot_check_script,
    token_path,
    wanted_repos,
)
from sparkctl.tasks.model_copy import ModelCopyTask, is_peer_in_copy_mode
from sparkctl.tasks.model_progress import TransferProgress, directory_size_reader, human_bytes, rate_text
from sparkctl.transport.base import q

# Re-exported: the serve tasks and the CLI import them from here.
__all__ = ["DOWNLOAD_TIMEOUT", "GATED_MARK", "ModelFetchTask", "ModelFitTask", "ModelTokenTask", "TASKS",
           "gated_repos_failed", "hf_token", "host_path", "provide_token", "serving_enabled", "token_path",
           "wanted_repos"]

#: In the failure message of a download refused for lack of a token (the CLI offers a prompt on it).
GATED_MARK = " is a gated repo and "


#: Tokens the user typed at the CLI's prompt, by the variable name they stand in for (never in os.environ:
#: local subprocesses would inherit it).
_provided_tokens: dict[str, str] = {}


def provide_token(env_name: str, token: str) -> None:
    """A token from the CLI's prompt, used as if the variable named `env_name` held it."""
    register_secret(token)
    _provided_tokens[env_name] = token


def hf_token(inventory) -> str | None:
    """The token from the variable named by serve.hf_token_env, the file named by <that name>_FILE, or the prompt."""
    name = inventory.serve.hf_token_env
    token = os.environ.get(name, "").strip()
    if not token and os.environ.get(f"{name}_FILE"):
        try:
            token = Path(os.environ[f"{name}_FILE"]).read_text().strip()
        except OSError as exc:
            raise TaskFailed(f"cannot read the token file named by {name}_FILE: {exc.strerror}") from exc
    token = token or _provided_tokens.get(name, "")
    if not token:
        return None
    register_secret(token)
    return token


class ModelFitTask(Task):
    name = "model.fit"
    phase = "model"
    scope = Scope.CLUSTER
    needs = ("preflight.node",)
    description = "refuse a model that cannot fit before anything is downloaded"
    checks = ("per node: the target's weights / tp_size + the draft + a KV-cache reserve against the node's "
              "MemTotal; refused when larger, a warning above 90%")
    changes = "nothing (read-only)"

    def check(self, ctx) -> list[Change]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        spec = inv.serve_spec()
        ranks = min(spec.tp_size, len(inv.nodes))
        refused = []
        for name, nctx in ctx.nodes.items():
            verdict = fit_verdict(name, spec.model, spec.weights_gb, ranks, spec.draft_gb,
                                  nctx.facts().mem_total_kb)
            if verdict.refused:
                refused.append(verdict.line)
            elif verdict.verdict in ("tight", "unknown"):
                ctx.warn(verdict.line, task=self.name)
            else:
                ctx.emit(Event(event="log", task=self.name, node=name, message=verdict.line))
        if not refused:
            return []
        hint = refusal_hint(spec.tp_size, len(inv.nodes))
        if inv.serve.fit_check == "warn":
            ctx.warn(f"{refused[0]} (going on: serve.fit_check is warn)", task=self.name)
            return []
        raise TaskFailed(refused[0], hint=f"{hint}; serve.fit_check: warn to try anyway", details=refused[1:])


class ModelTokenTask(Task):
    name = "model.token"
    phase = "model"
    needs = ("container.state",)
    description = "put the Hugging Face token on the node as a 0600 file in the HF cache"
    checks = ("when the variable named by serve.hf_token_env (or <name>_FILE) holds a token: <hf_cache>/token "
              "has mode 600 and the token's sha256 (the token itself never travels back); with serve.distribute: "
              "copy only the head's (the peers' ranks load the copied snapshot, no Hub access)")
    changes = "writes <hf_cache>/token, mode 600, atomically, content on stdin (never in argv)"

    def check(self, ctx) -> list[Change]:
        # A peer in copy mode never talks to the Hub: its ranks load the copied snapshot from the cache.
        if not serving_enabled(ctx.inventory) or is_peer_in_copy_mode(ctx):
            return []
        token = hf_token(ctx.inventory)
        if token is None:
            return []
        path = token_path(ctx)
        result = ctx.run(f"[ -f {q(path)} ] && stat -c %a {q(path)} && sha256sum < {q(path)}; true", timeout=30)
        lines = result.stdout.split()
        want = hashlib.sha256(token.encode()).hexdigest()
        if len(lines) < 2:
            return [Change(f"write the HF token to {path} (mode 600)")]
        if lines[1] != want:
            return [Change(f"replace the HF token in {path} (it holds another one)")]
        if lines[0] != "600":
            return [Change(f"chmod 600 {path} (it is {lines[0]})")]
        return []

    def apply(self, ctx, changes) -> None:
        token = hf_token(ctx.inventory)
        assert token is not None
        ctx.transport.put(token_path(ctx), token, mode=0o600)


def gated_hint(repo: str, env: str) -> str:
    return (f"accept the license at https://huggingface.co/{repo} with your account, then export {env}=<your "
            f"token> (serve.hf_token_env names the variable) and rerun; sparkctl puts it on each node as a 0600 "
            f"file")


class ModelFetchTask(Task):
    name = "model.fetch"
    phase = "model"
    needs = ("model.fit", "model.token", "container.run")
    description = "download the model and its draft into the mounted HF cache on every node"
    checks = ("the model's hub-cache snapshot (refs/main) and the draft's dir in <hf_cache>/sparkctl-models/ "
              "each hold config.json and every weight file, nothing half-downloaded (no network needed); "
              "with serve.distribute: copy only the head's (model.copy serves the peers)")
    changes = ("`hf download` inside the container (resumes partial files), with the bytes so far logged every "
               "few seconds; the token comes from the 0600 token file; a gated repo without a token fails with "
               "the license hint")

    def check(self, ctx) -> list[Change]:
        if not serving_enabled(ctx.inventory) or is_peer_in_copy_mode(ctx):
            return []
        repos = wanted_repos(ctx.inventory)
        result = ctx.must(snapshot_check_script(ctx, repos), "checking the HF cache", timeout=60)
        changes = []
        for line in result.stdout.splitlines():
            verdict, _, rest = line.partition(" ")
            repo, _, why = rest.partition(" ")
            if verdict == "missing":
                local = dict(repos).get(repo)
                where = local or f"{CONTAINER_HF_HOME}/hub"
                changes.append(Change(f"download {repo} into {where} ({why})", payload=(repo, local)))
        return changes

    def apply(self, ctx, changes) -> None:
        container = ctx.inventory.container.name
        env = ctx.inventory.serve.hf_token_env
        for change in changes:
            repo, local = change.payload
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


def _download_failure(node: str, repo: str, result, env: str) -> TaskFailed:
    output = (result.stderr or result.stdout).strip()
    tail = output.splitlines()[-3:]
    if "GatedRepoError" in output or "Cannot access gated repo" in output:
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


TASKS = [ModelFitTask(), ModelTokenTask(), ModelFetchTask(), ModelCopyTask()]
