"""`sparkctl playbooks`: the playbooks in words (the source of playbooks.md)."""

from __future__ import annotations

import click

from sparkctl.cli.report import json_option, output_file, report_line, terminal_width, verbose_option
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.playbooks import playbooks_data, playbooks_markdown, playbooks_text


@click.command("playbooks")
@click.option("--markdown", is_flag=True, help="Markdown, as committed in playbooks.md.")
@click.option("-o", "--output", default="-", show_default=True, type=click.Path(dir_okay=False),
              help="Write to this file ('-': stdout).")
@json_option
@verbose_option
def playbooks_command(markdown: bool, output: str, as_json: bool, verbose: int) -> None:
    """Describe every playbook: its phases and tasks, what each checks and what it changes."""
    if as_json:
        report_line("playbooks", ExitStatus.SUCCESS, playbooks=playbooks_data())
        return
    text = playbooks_markdown() if markdown else playbooks_text(max(60, (terminal_width() or 100) - 2))
    with output_file(output, "--output") as handle:
        handle.write(text)
