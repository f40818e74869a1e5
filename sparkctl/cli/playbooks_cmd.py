"""`sparkctl playbooks`: the playbooks in words (the source of playbooks.md)."""

from __future__ import annotations

import click

from sparkctl.runs.outputs import check_writable
from sparkctl.runs.playbooks import playbooks_markdown


@click.command("playbooks")
@click.option("--markdown", is_flag=True, help="Markdown, as committed in playbooks.md.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write to this file instead of stdout.")
def playbooks_command(markdown: bool, output: str | None) -> None:
    """Describe every playbook: its phases and tasks, what each checks and what it changes."""
    text = playbooks_markdown()
    if output:
        check_writable(output, "--output")
        with open(output, "w") as fh:
            fh.write(text)
        return
    click.echo(text, nl=False)
