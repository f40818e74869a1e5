"""The `sparkctl` command: thin click commands; expected errors as one line plus a hint, exit codes from one enum."""

from __future__ import annotations

import logging
import os
import sys
import traceback

import click

from sparkctl import __version__
from sparkctl.cli.report import JSON_META, error_line
from sparkctl.errors import InventoryError, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.secrets import redact_known, redacting_handler


class SparkctlGroup(click.Group):
    """Turns expected errors into `sparkctl: error: ...` lines, and any other into one `internal error` line; the
    traceback only with --debug."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except SparkctlError as exc:
            if ctx.find_root().params.get("debug"):
                traceback.print_exc()
            _print_error(exc)
            if ctx.meta.get(JSON_META):
                _json_error(exc)
            sys.exit(int(exc.exit_status))
        except Exception as exc:  # noqa: BLE001 - a bug must still end in one line, not a traceback
            if ctx.find_root().params.get("debug"):
                traceback.print_exc()
            message = redact_known(f"internal error: {type(exc).__name__}: {exc}")
            hint = "this is a bug in sparkctl: run again with --debug for the traceback and report it"
            click.echo(f"sparkctl: {message}", err=True)
            click.echo(f"  hint: {hint}", err=True)
            if ctx.meta.get(JSON_META):
                error_line(message, ExitStatus.TASK_FAILED, hint)
            sys.exit(int(ExitStatus.TASK_FAILED))


def _json_error(exc: SparkctlError) -> None:
    """--json: the failure as the last line on stdout too, with its exit status."""
    if isinstance(exc, InventoryError):
        count = len(exc.problems)
        error_line(f"{count} problem{'s' if count != 1 else ''} in the inventory; nothing was changed",
                   exc.exit_status, details=exc.problems)
        return
    error_line(exc.message, exc.exit_status, exc.hint, exc.details)


def _print_error(exc: SparkctlError) -> None:
    if isinstance(exc, InventoryError):
        for line in exc.problems:
            click.echo(line, err=True)
        count = len(exc.problems)
        click.echo(f"sparkctl: {count} problem{'s' if count != 1 else ''} in the inventory; nothing was changed",
                   err=True)
        return
    click.echo(f"sparkctl: error: {exc.message}", err=True)
    for line in exc.details:
        click.echo(f"  {line}", err=True)
    if exc.hint:
        click.echo(f"  hint: {exc.hint}", err=True)


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
    # paramiko logs every failed handshake with its traceback from its own thread; sparkctl already says why
    # in one line per node (transport.ssh). --debug shows them.
    logging.getLogger("paramiko.transport").setLevel(logging.NOTSET if debug else logging.CRITICAL)


def _register() -> None:
    from sparkctl.cli.cluster_cmd import cluster_group
    from sparkctl.cli.doctor_cmd import doctor_command
    from sparkctl.cli.inventory_cmd import inventory_group
    from sparkctl.cli.playbooks_cmd import playbooks_command
    from sparkctl.cli.serve_cmd import serve_group

    cli.add_command(inventory_group)
    cli.add_command(cluster_group)
    cli.add_command(playbooks_command)
    cli.add_command(doctor_command)
    cli.add_command(serve_group)
    try:
        from sparkctl.cli.lab_cmd import lab_group
    except ImportError:  # the lab needs nothing extra, but a broken lab must not break the product
        return
    cli.add_command(lab_group)


_register()


def main() -> None:
    try:
        cli(prog_name="sparkctl")
    except KeyboardInterrupt:
        click.echo("sparkctl: interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()

__all__ = ["ExitStatus", "cli", "main"]
