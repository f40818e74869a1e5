"""`sparkctl top INVENTORY`: watch the cluster work, live (or --once, --json, --serve-metrics)."""

from __future__ import annotations

import sys
import time

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sparkctl.cli.console import console as rich_console
from sparkctl.cli.options import csv_set, load
from sparkctl.cli.report import VERBOSE_HELP, json_line, note_json, note_verbose, print_table, terminal_width
from sparkctl.errors import BadInput
from sparkctl.exitcodes import ExitStatus
from sparkctl.taskgraph.runner import DEFAULT_FORKS

DEFAULT_INTERVAL = 2.0


def _address(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--serve-metrics {value!r}: expected HOST:PORT (e.g. 127.0.0.1:9464)",
                       hint="HOST is the address to listen on (0.0.0.0 for every one), PORT a free TCP port")
    return host.strip("[]") or "0.0.0.0", int(port)


def _n(value: float | None, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "-" if value is None else fmt.format(value) + unit


def node_rows(frame) -> list[list[str | Text]]:
    rows: list[list[str | Text]] = []
    for node in frame.nodes:
        if not node.answering:
            rows.append([node.node, Text("not answering", style="red"), node.why[:60], "", "", ""])
            continue
        mem = f"{_n(node.mem_used_gib, '{:.1f}')}/{_n(node.mem_total_gib, '{:.1f}')} GiB"
        gpu_mem = (f"{_n(node.gpu_mem_used_mib)}/{_n(node.gpu_mem_total_mib)} MiB"
                   if node.gpu_mem_total_mib is not None else "unified")
        rows.append([node.node, f"{_n(node.gpu_util_pct, unit='%')} {gpu_mem}",
                     f"{_n(node.gpu_temp_c, unit='°C')} {_n(node.gpu_power_w, '{:.1f}', ' W')}",
                     _n(node.cpu_pct, unit="%"), mem, node.container])
    return rows


def link_rows(frame) -> list[list[str | Text]]:
    rows: list[list[str | Text]] = []
    for node in frame.nodes:
        for link in node.links:
            mark = " *" if link.nccl else ""
            trouble = (link.errors or 0) + (link.drops or 0)
            rows.append([node.node, f"{link.interface}{mark}", link.role, _n(link.rx_gbps, "{:.3f}"),
                         _n(link.tx_gbps, "{:.3f}"),
                         Text(f"{_n(link.errors)}/{_n(link.drops)}", style="red" if trouble else ""),
                         link.counters])
    return rows


def serving_rows(frame) -> list[list[str]]:
    """One row of the serving figures, or with several worlds one per world, named by its model."""
    if frame.worlds:
        return [_serving_row(w, f"{w['model']} ({w['engine']})") for w in frame.worlds]
    return [_serving_row(frame.serving, frame.serving["engine"])] if frame.serving else []


def _serving_row(s: dict, name: str) -> list[str]:
    if s.get("metrics_status") != 200:
        return [name, f"/metrics answered {s.get('metrics_status') or 'nothing'}", "", "", "", "", ""]
    kv = s.get("kv_cache_fraction")
    return [name, f"{_n(s.get('running'))} / {_n(s.get('waiting'))}",
            _n(s.get("prompt_tps"), "{:.1f}"), _n(s.get("generation_tps"), "{:.1f}"),
            _n(None if s.get("ttft_p50_s") is None else s["ttft_p50_s"] * 1000, "{:.0f}", " ms"),
            _n(None if kv is None else kv * 100, "{:.0f}", "%"), _n(s.get("acceptance"), "{:.2f}")]


NODE_HEADERS = ("node", "GPU util, memory", "GPU temp, power", "CPU", "memory", "container")
LINK_HEADERS = ("node", "interface (* NCCL's)", "role", "rx Gb/s", "tx Gb/s", "errors/drops", "counters")
SERVE_HEADERS = ("engine", "running / waiting", "prompt tok/s", "gen tok/s", "TTFT p50", "KV cache", "acceptance")


def _table(title: str, headers: tuple[str, ...], rows) -> Table:
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    return table


def view(frame) -> Group:
    parts = [_table(f"{frame.cluster}: nodes", NODE_HEADERS, node_rows(frame)),
             _table("links", LINK_HEADERS, link_rows(frame))]
    serving = serving_rows(frame)
    if serving:
        parts.append(_table("serving", SERVE_HEADERS, serving))
    return Group(*parts)


def print_once(frame) -> None:
    print_table(f"{frame.cluster}: nodes", NODE_HEADERS, node_rows(frame))
    print_table("links", LINK_HEADERS, link_rows(frame))
    serving = serving_rows(frame)
    if serving:
        print_table("serving", SERVE_HEADERS, serving)


@click.command("top")
@click.argument("file", metavar="INVENTORY", type=click.Path(dir_okay=False))
@click.option("--interval", type=click.FloatRange(0.5, 3600), default=DEFAULT_INTERVAL, show_default=True,
              metavar="SECONDS", help="Seconds between refreshes.")
@click.option("--once", is_flag=True, help="One table (two readings an interval apart, for the rates), then exit.")
@click.option("--limit", metavar="NODE[,NODE]", help="Watch these nodes only.")
@click.option("--forks", type=click.IntRange(1, 256), default=DEFAULT_FORKS, show_default=True,
              help="How many nodes to read at once.")
@click.option("--serve-metrics", metavar="HOST:PORT",
              help="Also expose the figures for Prometheus on HOST:PORT (/metrics; docs/top.md).")
@click.option("--json", "as_json", is_flag=True, callback=note_json, is_eager=True,
              help="One JSON object per refresh on stdout (docs/events.md, event `top`).")
@click.option("-v", "--verbose", count=True, help=VERBOSE_HELP, callback=note_verbose)
def top_command(file: str, interval: float, once: bool, limit: str | None, forks: int, serve_metrics: str | None,
                as_json: bool, verbose: int) -> None:
    """Watch the cluster work: every node's GPU, CPU, memory and container, every fabric twin's traffic (the RoCE
    port's counters, RDMA included) and the serving figures, refreshed every --interval seconds."""
    from sparkctl.runs.top import open_top

    address = _address(serve_metrics)
    inventory = load(file)
    with open_top(inventory, limit=csv_set(limit), forks=forks, interval=interval) as top:
        exporter = None
        if address is not None:
            from sparkctl.runs.top_exporter import serve_metrics as start_exporter

            try:
                exporter, _port = start_exporter(*address)
            except OSError as exc:
                raise BadInput(f"--serve-metrics {serve_metrics}: cannot listen there: {exc.strerror or exc}",
                               hint="choose a free port, or an address of this machine") from None
            click.echo(f"sparkctl top: Prometheus metrics on http://{serve_metrics}/metrics", err=True)
        top.refresh()  # the first reading: rates need two
        live = not once and not as_json and sys.stdout.isatty()
        console = rich_console(width=terminal_width())
        with Live(console=console, auto_refresh=False, transient=False) if live else _NoLive() as screen:
            while True:
                time.sleep(interval)
                frame = top.refresh()
                if exporter is not None:
                    exporter.update(frame)
                if as_json:
                    json_line({"event": "top", **frame.to_dict()})
                elif live:
                    screen.update(view(frame), refresh=True)
                else:  # a pipe: one table per refresh, as `top -b`
                    print_once(frame)
                if once:
                    sys.exit(int(ExitStatus.SUCCESS))


class _NoLive:
    def __enter__(self) -> _NoLive:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, *_args: object, **_kwargs: object) -> None:
        return None
