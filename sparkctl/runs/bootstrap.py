"""`sparkctl cluster bootstrap` and `cluster down` end to end: a journaled run of the playbook; after a download
the Hub refused as gated, with no token anywhere, one prompt (when someone can answer it) and a second run."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from sparkctl.inventory import Inventory
from sparkctl.runs.journal import Journal
from sparkctl.runs.opening import Opening
from sparkctl.runs.playbooks import bootstrap_graph
from sparkctl.runs.request import RunRequest
from sparkctl.runs.session import run_playbook
from sparkctl.secrets import SecretUnreadable, provide_secret, secret_from_env
from sparkctl.taskgraph import Event, EventBus, Graph, RunResult
from sparkctl.tasks.model.fetch import gated_repos_failed

#: Asks a person for the token of the gated repos (the variable name it stands in for); None: nobody to ask,
#: or no answer.
TokenPrompt = Callable[[list[str], str], "str | None"]


def journaled_run(command: str, inventory: Inventory, graph: Graph, request: RunRequest,
                  view: Callable[[Event], None], opening: Opening | None = None) -> RunResult:
    """One run of `graph`, its events to `view` and to the run journal."""
    with Journal(command=command, cluster=inventory.cluster.name) as journal:
        return run_playbook(inventory, graph, request, EventBus([view, journal]), command=command, opening=opening)


def ask_for_gated_token(inventory: Inventory, result: RunResult, ask: TokenPrompt) -> bool:
    """A download refused as gated and no token anywhere: ask once; True when a token was given (the caller
    runs again; it converges: only the refused downloads and what needs them are left).

    Whether a repo is gated is known only once the Hub refuses it, so the prompt follows that refusal rather
    than asking on every run."""
    repos = gated_repos_failed(result.outcomes)
    if not repos or result.check_mode or result.interrupted:
        return False
    env = inventory.serve.hf_token_env
    try:
        if secret_from_env(env) is not None:
            return False  # a token is set but cannot see the repo: typing it again would not help
    except SecretUnreadable:
        return False
    token = (ask(repos, env) or "").strip()
    if not token:
        return False
    provide_secret(env, token)
    return True


ViewFactory = Callable[[], AbstractContextManager[Callable[[Event], None]]]


def bootstrap(inventory: Inventory, request: RunRequest, view: ViewFactory, ask: TokenPrompt,
              opening: Opening | None = None) -> RunResult:
    """`view()` opens the event sink of one run (a second run gets a fresh one); `opening`: the first run's
    connections and lock, started by the command (runs/opening.py)."""
    with view() as sink:
        result = journaled_run("bootstrap", inventory, bootstrap_graph(), request, sink, opening)
    if ask_for_gated_token(inventory, result, ask):
        with view() as sink:
            result = journaled_run("bootstrap", inventory, bootstrap_graph(), request, sink)
    return result
