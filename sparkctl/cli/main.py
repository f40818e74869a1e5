"""The `sparkctl` command: thin click commands; expected errors as one line plus a hint, exit codes from one enum."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import traceback
from typing import NoReturn

import click

from sparkctl import __version__
from sparkctl.cli.report import JSON_META, VERBOSE_META, error_line
from sparkctl.errors import InventoryError, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.secrets import redacted, redacting_handler

#: each lazily imported command's help, its first paragraph, which `--help` cuts to the line as click does (a test
#: keeps it the command's own)
SUMMARIES: dict[str, str] = {
    "cluster": "Bootstrap, inspect and take down a cluster of Sparks.",
    "doctor": "Find what is broken on the cluster, why, and how to fix it (read-only unless --fix).",
    "fabric": "Measure the CX-7 fabric: is every cable giving what a Spark's port can?",
    "inventory": "Check and describe inventory files.",
    "lab": "A lab of simulated DGX Sparks on this machine: namespaces, systemd, sshd, podman.",
    "playbooks": "Describe every playbook: its phases and tasks, what each checks and what it changes.",
    "serve": "The OpenAI-compatible endpoint `cluster bootstrap` starts: status, logs, chat, bench, stop.",
    "top": "Watch the cluster work: every node's GPU, CPU, memory and container, every fabric twin's traffic (the "
           "RoCE port's counters, RDMA included) and the serving figures, refreshed every --interval seconds.",
}


class SparkctlGroup(click.Group):
    """Turns expected errors into `sparkctl: error: ...` lines, and any other into one `internal error` line; the
    traceback only with --debug. Its commands are imported when asked for (LAZY), so a run pays only for the
    modules of the command at hand: `cluster bootstrap` does not import doctor, serve or the lab."""

    #: command name -> "module:attribute"; `optional` ones may fail to import (the lab, when its parts are broken)
    LAZY = {
        "inventory": "sparkctl.cli.inventory_cmd:inventory_group",
        "cluster": "sparkctl.cli.cluster_cmd:cluster_group",
        "playbooks": "sparkctl.cli.playbooks_cmd:playbooks_command",
        "doctor": "sparkctl.cli.doctor_cmd:doctor_command",
        "serve": "sparkctl.cli.serve_cmd:serve_group",
        "fabric": "sparkctl.cli.fabric_cmd:fabric_group",
        "top": "sparkctl.cli.top_cmd:top_command",
        "lab": "sparkctl.cli.lab_cmd:lab_group",
    }
    OPTIONAL = frozenset({"lab"})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, _, attribute = self.LAZY[cmd_name].partition(":")
            try:
                command = getattr(importlib.import_module(module), attribute)
            except ImportError:
                if cmd_name in self.OPTIONAL:  # a broken lab must not break the product
                    return None
                raise
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """`--help`'s list of commands from SUMMARIES, without importing every command's module (and through them
        pydantic, paramiko and rich): tests/unit/test_cli_startup.py keeps each summary the command's own."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max((len(n) for n in names), default=0)
        rows = []
        for name in names:
            if name in SUMMARIES:
                rows.append((name, click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit)))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.exceptions.Abort):
            # Ctrl-C outside a run (loading, connecting, at a prompt): one line and the shell's code for SIGINT,
            # never click's "Aborted!" and exit 1 (the code of a failed task)
            click.echo("\nsparkctl: interrupted; nothing more was started", err=True)
            sys.exit(int(ExitStatus.INTERRUPTED))
        except BrokenPipeError:
            _stdout_to_devnull()
            sys.exit(int(ExitStatus.BROKEN_PIPE))
        except (click.exceptions.ClickException, click.exceptions.Exit):
            raise
        except SparkctlError as exc:
            if ctx.find_root().params.get("debug"):
                _print_traceback()
            _print_error(exc)
            if ctx.meta.get(JSON_META):
                _json_error(exc)
            sys.exit(int(exc.exit_status))
        except Exception as exc:  # noqa: BLE001 - a bug must still end in one line, not a traceback
            if ctx.find_root().params.get("debug") or ctx.meta.get(VERBOSE_META, 0) >= 2:
                _print_traceback()
            message = redacted(f"internal error: {type(exc).__name__}: {exc}")
            hint = "this is a bug in sparkctl: run again with --debug for the traceback and report it"
            click.echo(f"sparkctl: {message}", err=True)
            click.echo(f"  hint: {hint}", err=True)
            if ctx.meta.get(JSON_META):
                error_line(message, ExitStatus.TASK_FAILED, hint)
            sys.exit(int(ExitStatus.TASK_FAILED))


def _stdout_to_devnull() -> None:
    """The reader of stdout is gone (`| head`): not a failure to report, and nothing more can reach it. What is
    still buffered goes to /dev/null, so Python's last flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        pass



def _json_error(exc: SparkctlError) -> None:
    """--json: the failure as the last line on stdout too, with its exit status."""
    if isinstance(exc, InventoryError):
        count = len(exc.problems)
        error_line(f"{count} problem{'s' if count != 1 else ''} in the inventory; nothing was changed",
                   exc.exit_status, details=exc.problems)
        return
    error_line(exc.message, exc.exit_status, exc.hint, exc.details)


def _print_traceback() -> None:
    """--debug's traceback, through the one redaction like every other line (a secret may be in a frame's text)."""
    click.echo(redacted(traceback.format_exc()).rstrip("\n"), err=True)


def _print_error(exc: SparkctlError) -> None:
    if isinstance(exc, InventoryError):
        for line in exc.problems:
            click.echo(redacted(line), err=True)
        count = len(exc.problems)
        click.echo(f"sparkctl: {count} problem{'s' if count != 1 else ''} in the inventory; nothing was changed",
                   err=True)
        return
    click.echo(redacted(f"sparkctl: error: {exc.message}"), err=True)
    for line in exc.details:
        click.echo(redacted(f"  {line}"), err=True)
    if exc.hint:
        click.echo(redacted(f"  hint: {exc.hint}"), err=True)


@click.group(cls=SparkctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="sparkctl")
@click.option("--debug", is_flag=True, default=lambda: bool(os.environ.get("SPARKCTL_DEBUG")),
              help="Show tracebacks for errors (also SPARKCTL_DEBUG=1).")
def cli(debug: bool) -> None:
    """Join NVIDIA DGX Sparks into a cluster over their CX-7 fabric and serve models too large for one box.

    \b
    sparkctl cluster bootstrap inventory.yaml   set up (or repair) the whole cluster, idempotently
    sparkctl doctor inventory.yaml              find what is broken, and why, and how to fix it
    """
    configure_logging(debug)


def configure_logging(debug: bool) -> None:
    """Log records (sparkctl's with --debug, any library's warnings always) reach stderr through the redacting
    handler only: a secret in a logged command or a library's message is masked like everywhere else."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "sparkctl", False)]:
        root.removeHandler(handler)
    handler = redacting_handler(sys.stderr, logging.DEBUG if debug else logging.WARNING)
    handler.sparkctl = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("sparkctl").setLevel(logging.DEBUG if debug else logging.NOTSET)
    # paramiko's transport logs a lost connection as an ERROR (with a traceback); sparkctl reports it once, on the
    # node it came from
    logging.getLogger("paramiko.transport").setLevel(logging.NOTSET if debug else logging.CRITICAL)


def main() -> None:
    try:
        cli(prog_name="sparkctl")
    except KeyboardInterrupt:
        click.echo("sparkctl: interrupted", err=True)
        _leave(int(ExitStatus.INTERRUPTED))
    except SystemExit as done:
        if isinstance(done.code, str):
            raise  # a message to print: the interpreter does that
        _leave(done.code or 0)
    _leave(0)


def _leave(code: int) -> NoReturn:
    """Exit without the interpreter's teardown, which frees every imported module's objects one by one (50-100 ms
    of every run, a no-op's included): the logs and the standard streams are flushed here as the interpreter would.
    Where a thread that is not a daemon still runs, or a stream cannot be flushed, the interpreter exits as usual
    (it waits for that thread; it reports that stream)."""
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()

__all__ = ["ExitStatus", "cli", "main"]
