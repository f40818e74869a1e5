"""`sparkctl fabric ...`: bench (bandwidth and latency per link, an NCCL all-reduce, verdicts)."""

from __future__ import annotations

import re
import sys

import click
from rich.table import Table
from rich.text import Text

from sparkctl.cli.console import console as rich_console
from sparkctl.cli.options import load
from sparkctl.cli.report import json_option, print_table, report_line, verbose_option
from sparkctl.exitcodes import ExitStatus
from sparkctl.runs.fabric_bench import BenchRequest, fabric_bench
from sparkctl.secrets import redacted
from sparkctl.taskgraph.runner import DEFAULT_FORKS

_SIZE = r"^\d+[KMG]?$"


@click.group("fabric")
def fabric_group() -> None:
    """Measure the CX-7 fabric: is every cable giving what a Spark's port can?"""


def _size(ctx, param, value: str) -> str:
    if not re.match(_SIZE, value):
        raise click.BadParameter("a byte count like 1M, 256M or 1G")
    return value


def _figure(value, unit: str, digits: str = ".3g") -> str:
    return "-" if value is None else f"{value:{digits}} {unit}"


BENCH_HEADERS = ("link", "method", "bandwidth", "latency", "verdict")


def bench_title(result: dict) -> str:
    return f"fabric bench: cluster {result['cluster']} ({result['time']})"


def bench_rows(result: dict) -> list[list[str | Text]]:
    rows: list[list[str | Text]] = []
    for link in result["links"]:
        method = link["method"] if link["method"] != "rdma" else f"RDMA {link.get('device') or ''}".strip()
        if link["method"] == "tcp":
            method = f"TCP (iperf3): {link['why_not_rdma']}"
        ok = (link.get("verdict") or {}).get("ok")
        rows.append([link["key"], method, _figure(link["gbps"], "Gb/s"), _figure(link["latency_us"], "us", ".3g"),
                     Text(link["summary"], style="green" if ok else "red")])
    return rows


def bench_table(result: dict) -> Table:
    """The table as rich draws it at a given width (the command prints it through report.print_table)."""
    table = Table(title=bench_title(result), show_lines=True)
    for col in BENCH_HEADERS:
        table.add_column(col, overflow="fold")
    for row in bench_rows(result):
        table.add_row(*row)
    return table


def nccl_lines(nccl: dict | None) -> list[Text]:
    if nccl is None:
        return []
    ok = (nccl.get("verdict") or {}).get("ok")
    out = [Text(f"NCCL all-reduce ({nccl.get('ranks', '?')} ranks): bus bandwidth "
                f"{_figure(nccl.get('busbw'), 'GB/s')}: {nccl['summary']}", style="green" if ok else "red")]
    for node, used in (nccl.get("transport") or {}).items():
        if used.get("network") == "IB" or used.get("ib_devices"):
            how = f"NET/IB with {', '.join(used['ib_devices']) or '?'}"
        else:
            how = f"Socket fallback over {', '.join(used.get('socket') or []) or '?'}" + \
                  (" (NET/IB : No device found)" if used.get("ib_no_device") else "")
        out.append(Text(f"  {node}: {how}"))
    return out


@fabric_group.command("bench")
@click.argument("file", type=click.Path())
@json_option
@click.option("--tcp", is_flag=True, help="Measure every link with iperf3 (TCP), even where RDMA could run.")
@click.option("--no-nccl", is_flag=True, help="Links only: skip the NCCL all-reduce in the containers.")
@click.option("--no-links", is_flag=True, help="NCCL only: skip the per-link perftest/iperf3 measurements.")
@click.option("--nccl-min", default="1M", show_default=True, callback=_size, help="all_reduce_perf -b.")
@click.option("--nccl-max", default="256M", show_default=True, callback=_size, help="all_reduce_perf -e.")
@click.option("--all-reduce-perf", "all_reduce_perf", metavar="PATH",
              help="all_reduce_perf inside the containers, when it is not on PATH or in a usual place.")
@click.option("--no-record", is_flag=True, help="Do not keep the figures (doctor and status compare with them).")
@click.option("--forks", type=click.IntRange(1, 256), default=DEFAULT_FORKS, show_default=True)
@verbose_option
def bench_command(file: str, as_json: bool, tcp: bool, no_nccl: bool, no_links: bool, nccl_min: str, nccl_max: str,
                  all_reduce_perf: str | None, no_record: bool, forks: int, verbose: int) -> None:
    """Bandwidth and latency of every fabric link (perftest over each twin's RoCE device, iperf3 where there is no
    RDMA), an NCCL all-reduce across the containers, and a verdict on each against a Spark's figures.

    Exit 0 when everything passes, 1 when something is below its figure or could not be measured, 3 when a node
    did not answer (and nothing measured failed).
    """
    inventory = load(file)
    if all_reduce_perf is not None and (not all_reduce_perf.startswith("/") or any(c in all_reduce_perf
                                                                                  for c in "\n\"'`$\\")):
        raise click.BadParameter("an absolute path without quotes or `$`", param_hint="--all-reduce-perf")
    console = rich_console(stderr=as_json, highlight=False, soft_wrap=True)
    request = BenchRequest(forks=forks, links=not no_links, nccl=not no_nccl, tcp=tcp, nccl_min=nccl_min,
                           nccl_max=nccl_max, all_reduce_perf=all_reduce_perf, record=not no_record)
    result = fabric_bench(inventory, request, progress=lambda line: console.print(Text(redacted(line), style="dim")))
    exit_status = bench_status(result)
    if as_json:
        report_line("fabric bench", exit_status, **redacted(result))
    else:
        out = rich_console(highlight=False, soft_wrap=True)  # a line is never cut: in a pipe it stays whole
        if result["links"]:
            shown = redacted(result)
            print_table(bench_title(shown), BENCH_HEADERS, bench_rows(shown))
        for line in nccl_lines(redacted(result.get("nccl"))):
            out.print(line)
        for node, why in result["unreachable"].items():
            out.print(Text(f"{node}: unreachable: {why}", style="red"))
        if result.get("recorded"):
            out.print(Text(f"recorded: {result['recorded']}", style="dim"))
    sys.exit(int(exit_status))


def bench_status(result: dict) -> ExitStatus:
    """1 when something measured is below its figure or failed to measure, else 3 when a node did not answer
    (what needed it was not measured), else 0: the precedence of the other commands' exit codes."""
    checks = [link.get("verdict", {}).get("ok") for link in result["links"]]
    nccl = result.get("nccl")
    if nccl is not None and not nccl.get("unreachable"):
        checks.append((nccl.get("verdict") or {}).get("ok"))
    if not all(checks):
        return ExitStatus.TASK_FAILED
    return ExitStatus.UNREACHABLE if result["unreachable"] else ExitStatus.SUCCESS
