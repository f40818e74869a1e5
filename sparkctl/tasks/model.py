"""model.fit, model.token, model.fetch: will it fit, the HF token as a 0600 file, model and draft in the HF cache.

Downloads run inside the container (`hf download`), into the mounted HF cache, so they outlive the container:
the model into the hub cache (trtllm-serve finds it by repo id), the draft into `sparkctl-models/` in the same
cache (the config names it by path). huggingface_hub reads the token from `$HF_HOME/token`: the token never
appears on a command line, in the environment of `docker exec`, a log or an event.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import time
from pathlib import Path

from sparkctl.engine.events import Event
from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.fitcheck import fit_verdict, refusal_hint
from sparkctl.plan.container import CONTAINER_HF_HOME
from sparkctl.plan.serve import draft_dir
from sparkctl.secrets import register_secret
from sparkctl.tasks.container_ssh import hf_cache_dir
from sparkctl.transport.base import q

DOWNLOAD_TIMEOUT = 6 * 3600.0


def serving_enabled(inventory) -> bool:
    """Serving is set up only for an inventory with a `serve:` section (a bare cluster is a valid goal)."""
    return "serve" in inventory.model_fields_set


def hf_token(inventory) -> str | None:
    """The token from the variable named by serve.hf_token_env, or from the file named by <that name>_FILE."""
    name = inventory.serve.hf_token_env
    token = os.environ.get(name, "").strip()
    if not token and os.environ.get(f"{name}_FILE"):
        try:
            token = Path(os.environ[f"{name}_FILE"]).read_text().strip()
        except OSError as exc:
            raise TaskFailed(f"cannot read the token file named by {name}_FILE: {exc.strerror}") from exc
    if not token:
        return None
    register_secret(token)
    return token


def token_path(ctx) -> str:
    return posixpath.join(hf_cache_dir(ctx), "token")


def host_path(ctx, container_path: str) -> str:
    """The node-side path of a path inside the container's HF cache mount."""
    return hf_cache_dir(ctx) + container_path[len(CONTAINER_HF_HOME):]


def wanted_repos(inventory) -> list[tuple[str, str | None]]:
    """(repo, local dir in the container or None for the hub cache): the model, then the draft."""
    spec = inventory.serve_spec()
    out: list[tuple[str, str | None]] = [(spec.model, None)]
    if spec.draft and spec.decoding != "none":
        out.append((spec.draft, draft_dir(spec.draft)))
    return out


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
              "has mode 600 and the token's sha256 (the token itself never travels back)")
    changes = "writes <hf_cache>/token, mode 600, atomically, content on stdin (never in argv)"

    def check(self, ctx) -> list[Change]:
        if not serving_enabled(ctx.inventory):
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


def snapshot_check_script(ctx, repos: list[tuple[str, str | None]]) -> str:
    """Per repo one line: `complete <repo>` or `missing <repo> <why>`; complete = config.json + every weight."""
    lines = []
    for repo, local in repos:
        if local is None:
            base = posixpath.join(hf_cache_dir(ctx), "hub", "models--" + repo.replace("/", "--"))
            lines.append(f'b={q(base)}; r=$(cat "$b"/refs/main 2>/dev/null); s="$b/snapshots/$r"; '
                         f'[ -n "$r" ] || s=/nonexistent')
        else:
            lines.append(f"s={q(host_path(ctx, local))}")
        lines.append(
            f'if [ ! -f "$s"/config.json ]; then echo missing {q(repo)} no config.json; '
            f'elif find "$s" -name "*.incomplete" 2>/dev/null | grep -q .; then echo missing {q(repo)} partial; '
            f'elif [ -f "$s"/model.safetensors.index.json ]; then ok=1; '
            f'for w in $(grep -o "[^\\"]*\\.safetensors" "$s"/model.safetensors.index.json | sort -u); do '
            f'[ -e "$s/$w" ] || ok=; done; '
            f'if [ -n "$ok" ]; then echo complete {q(repo)}; else echo missing {q(repo)} shards; fi; '
            f'elif ls "$s"/*.safetensors >/dev/null 2>&1; then echo complete {q(repo)}; '
            f'else echo missing {q(repo)} no weights; fi')
    return "\n".join(lines)


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
              "each hold config.json and every weight file, nothing half-downloaded (no network needed)")
    changes = ("`hf download` inside the container (resumes partial files); the token comes from the 0600 "
               "token file; a gated repo without a token fails with the license hint")

    def check(self, ctx) -> list[Change]:
        if not serving_enabled(ctx.inventory):
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
            ctx.log(f"downloading {repo} (resumes what an earlier run left)")
            started = time.monotonic()
            result = ctx.transport.exec_in(container, command, timeout=DOWNLOAD_TIMEOUT)
            seconds = time.monotonic() - started
            if not result.ok:
                raise _download_failure(ctx.name, repo, result, env)
            size = self._size(ctx, repo, local)
            rate = f", {size / seconds / 1e6:.1f} MB/s" if size and seconds > 0 else ""
            ctx.log(f"downloaded {repo}: {size / 1e9:.2f} GB in {seconds:.1f}s{rate}")

    @staticmethod
    def _size(ctx, repo: str, local: str | None) -> int:
        path = host_path(ctx, local) if local else posixpath.join(
            hf_cache_dir(ctx), "hub", "models--" + repo.replace("/", "--"))
        result = ctx.run(f"du -sLb {q(path)} 2>/dev/null | cut -f1", timeout=60)
        value = result.stdout.strip()
        return int(value) if value.isdigit() else 0


def _download_failure(node: str, repo: str, result, env: str) -> TaskFailed:
    output = (result.stderr or result.stdout).strip()
    tail = output.splitlines()[-3:]
    if "GatedRepoError" in output or "Cannot access gated repo" in output:
        return TaskFailed(f"{repo} is a gated repo and {node} has no valid Hugging Face token",
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


TASKS = [ModelFitTask(), ModelTokenTask(), ModelFetchTask()]
