"""Options shared by the commands that walk a playbook, and the plumbing from them to views and a run.

Light: a command checks its input and starts connecting (`early_opening`) before it loads what runs the tasks;
the console view (rich) loads with the run."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from sparkctl.cli.report import VERBOSE_HELP, note_json, note_verbose
from sparkctl.errors import BadInput
from sparkctl.inventory import Inventory, load_inventory
from sparkctl.runs.lock import Holder
from sparkctl.runs.opening import Opening
from sparkctl.runs.request import RunRequest, check_limit, selected
from sparkctl.secrets import register_secret
from sparkctl.taskgraph.graph import Graph
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.userfiles import UnreadableFile, read_limited

if TYPE_CHECKING:
    from sparkctl.cli.json_view import JsonView
    from sparkctl.cli.views import ConsoleView

#: A password file holds one line.
PASSWORD_FILE_LIMIT = 4096

BECOME_ENV = "SPARKCTL_BECOME_PASSWORD"


def csv_set(value: str | None) -> set[str] | None:
    return {v.strip() for v in value.split(",") if v.strip()} if value else None


#: the options a run of the whole cluster does without (`serve rollback` puts back what every node ran)
PART_OPTIONS = ("--limit", "--only", "--skip")


def run_options(func):
    """--check --diff --limit --only --skip --forks -v --json --ask-become-pass --become-password-file --reprove
    --refresh --revert-after."""
    return _with_options(func, _run_option_list())


def whole_cluster_run_options(func):
    """run_options without --limit, --only and --skip."""
    return _with_options(func, [o for o in _run_option_list() if o[0] not in PART_OPTIONS])


def _with_options(func, options):
    for _name, option in reversed(options):
        func = option(func)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


def _run_option_list() -> list[tuple[str, Callable]]:
    """(its first flag, the option) of every option of a run."""
    return [
        ("--check", click.option("--check", is_flag=True,
                                 help="Change nothing: report what would change (exit 4 if anything).")),
        ("--diff", click.option("--diff", is_flag=True,
                                help="Show unified diffs of the files that change (or would).")),
        ("--limit", click.option("--limit", metavar="NODE[,NODE]", help="Run on these nodes only.")),
        ("--only", click.option("--only", metavar="PHASE|TASK[,...]", help="Run only these phases or tasks.")),
        ("--skip", click.option("--skip", metavar="PHASE|TASK[,...]", help="Skip these phases or tasks.")),
        ("--forks", click.option("--forks", type=click.IntRange(1, 256), default=DEFAULT_FORKS, show_default=True,
                                 help="How many nodes to work on at once.")),
        ("-v", click.option("-v", "--verbose", count=True, help=VERBOSE_HELP, callback=note_verbose)),
        ("--json", click.option("--json", "as_json", is_flag=True, callback=note_json, is_eager=True,
                                help="One JSON object per event on stdout (docs/events.md); the last one is the "
                                     "recap.")),
        ("-K", click.option("-K", "--ask-become-pass", is_flag=True,
                            help=f"Prompt once for the sudo password (or set {BECOME_ENV}).")),
        ("--become-password-file", click.option("--become-password-file",
                                                type=click.Path(dir_okay=False, exists=True),
                                                help="Read the sudo password from this file (first line).")),
        ("--reprove", click.option("--reprove", is_flag=True,
                                   help="Run every proof again, also those a no-op rerun takes from the record (the "
                                        "MPI probe: see playbooks.md, verify.fabric).")),
        ("--refresh", click.option("--refresh", is_flag=True,
                                   help="Resolve the model's revision (serve.revision, else main) and the draft's on "
                                        "the Hub again and serve what they are now (model.pin).")),
        ("--revert-after", click.option("--revert-after", type=click.IntRange(10, 3600), default=60,
                                        show_default=True, metavar="SECONDS",
                                        help="A node reverts a netplan change by itself unless sparkctl reaches it "
                                             "over a new connection within this time after the apply.")),
    ]


def load(file: str, warn: bool = True) -> Inventory:
    """The inventory of a command, its warnings (what loaded but is most likely a mistake) on stderr."""
    inventory = load_inventory(file)
    for line in inventory.warnings if warn else ():
        click.echo(f"sparkctl: warning: {line}", err=True)
    return inventory


def become_password(ask: bool, path: str | None) -> str | None:
    password = None
    if path:
        try:
            text = read_limited(path, PASSWORD_FILE_LIMIT).decode()
        except (UnreadableFile, UnicodeDecodeError) as exc:
            reason = exc.reason if isinstance(exc, UnreadableFile) else "not UTF-8 text"
            raise BadInput(f"--become-password-file {path}: cannot read it: {reason}",
                           hint="a text file whose first line is the sudo password") from None
        password = text.splitlines()[0] if text else ""
    elif os.environ.get(BECOME_ENV):
        password = os.environ[BECOME_ENV]
    elif ask:
        if not sys.stdin.isatty():
            raise BadInput("--ask-become-pass needs a terminal",
                           hint=f"use --become-password-file or {BECOME_ENV} instead")
        password = click.prompt("sudo password", hide_input=True, err=True)
    register_secret(password)
    return password


def build_request(params: dict) -> RunRequest:
    return RunRequest.of(check=params["check"], diff=params["diff"], verbosity=params["verbose"],
                         revert_after=params["revert_after"], reprove=params.get("reprove", False),
                         refresh=params.get("refresh", False),
                         become_password=become_password(params["ask_become_pass"], params["become_password_file"]),
                         limit=csv_set(params.get("limit")), only=csv_set(params.get("only")),
                         skip=csv_set(params.get("skip")),
                         forks=params["forks"])


@contextmanager
def early_opening(command: str, inventory: Inventory, request: RunRequest,
                  graph: Callable[[], Graph]) -> Iterator[Opening]:
    """The run's connections, and its cluster lock unless --check, opened in the background (runs/opening.py)
    once all of the input is checked: --limit, and --only/--skip against `graph()` (which then loads first)."""
    check_limit(inventory, request.limit)
    if request.only or request.skip:
        selected(graph(), request)
    holder = None if request.options.check else Holder.now(command, request.limit)
    with Opening(inventory, forks=request.forks, become_password=request.options.become_password,
                 holder=holder) as opening:
        yield opening


@contextmanager
def run_view(params: dict) -> Iterator[ConsoleView | JsonView]:
    """The view of one run's events: JSON lines with --json, else the console."""
    if params["as_json"]:
        from sparkctl.cli.json_view import JsonView

        yield JsonView(sys.stdout)
        return
    from sparkctl.cli.console import console
    from sparkctl.cli.views import ConsoleView

    view = ConsoleView(console(stderr=False, highlight=False, soft_wrap=True), verbosity=params["verbose"],
                       show_diff=params["diff"])
    try:
        yield view
    finally:
        view.close()
