"""model.token: the Hugging Face token on the node as a 0600 file in the HF cache (huggingface_hub reads
`$HF_HOME/token`): never on a command line, in the environment of `docker exec`, a log or an event."""

from __future__ import annotations

import hashlib

from sparkctl.inventory import Inventory
from sparkctl.rules.serving import serves
from sparkctl.secrets import SecretUnreadable, secret_from_env
from sparkctl.taskgraph.task import Change, Task, TaskFailed
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import in_copy_mode_peer, token_path
from sparkctl.transport.base import q


def hf_token(inventory: Inventory) -> str | None:
    """The token from the variable named by serve.hf_token_env, the file named by <that name>_FILE, or the
    prompt (registered for masking)."""
    try:
        return secret_from_env(inventory.serve.hf_token_env)
    except SecretUnreadable as exc:
        raise TaskFailed(str(exc)) from exc


class ModelTokenTask(Task[NodeContext, None]):
    name = "model.token"
    phase = "model"
    needs = ("container.state",)
    description = "put the Hugging Face token on the node as a 0600 file in the HF cache"
    checks = ("when the variable named by serve.hf_token_env (or <name>_FILE) holds a token: <hf_cache>/token "
              "has mode 600 and the token's sha256 (the token itself never travels back); with serve.distribute: "
              "copy only the head's (the peers' ranks load the copied snapshot, no Hub access); on a rerun read ahead "
              "with the node's facts (what succeeded there counts)")
    changes = "writes <hf_cache>/token, mode 600, atomically, content on stdin (never in argv)"

    def check(self, ctx: NodeContext) -> list[Change[None]]:
        # A peer in copy mode never talks to the Hub: its ranks load the copied snapshot from the cache.
        if not serves(ctx.inventory, ctx.name) or in_copy_mode_peer(ctx):
            return []
        token = hf_token(ctx.inventory)
        if token is None:
            return []
        path = token_path(ctx)
        result = ctx.read_output(self.name, f"[ -f {q(path)} ] && stat -c %a {q(path)} && sha256sum < {q(path)}; true",
                                 timeout=30)
        lines = result.stdout.split()
        want = hashlib.sha256(token.encode()).hexdigest()
        if len(lines) < 2:
            return [Change(f"write the HF token to {path} (mode 600)")]
        if lines[1] != want:
            return [Change(f"replace the HF token in {path} (it holds another one)")]
        if lines[0] != "600":
            return [Change(f"chmod 600 {path} (it is {lines[0]})")]
        return []

    def apply(self, ctx: NodeContext, changes: list[Change[None]]) -> None:
        token = hf_token(ctx.inventory)
        assert token is not None
        ctx.transport.put(token_path(ctx), token, mode=0o600)
