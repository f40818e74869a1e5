"""`sparkctl serve ...`: presets, status, logs, chat, bench, stop — the everyday commands for the endpoint."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

import click
from rich.console import Console
from rich.table import Table

from sparkctl.errors import BadInput, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory import load_inventory
from sparkctl.presets import PRESETS
from sparkctl.secrets import redact_known
from sparkctl.serve_client import EndpointError, ServeClient, acceptance_from_metrics, endpoint_url

FILE = click.argument("file", type=click.Path(dir_okay=False))


@click.group("serve")
def serve_group() -> None:
    """The OpenAI-compatible endpoint `cluster bootstrap` starts: status, logs, chat, bench, stop."""


def _endpoint(inventory) -> str:
    return endpoint_url(str(inventory.head.host), inventory.serve_spec().port)


@contextmanager
def _connected(inventory, node_name: str):
    from sparkctl.session import _transport_options, node_specs
    from sparkctl.tasks.context import RunOptions
    from sparkctl.transport.connect import open_transport

    spec = next((s for s in node_specs(inventory) if s.node == node_name), None)
    if spec is None:
        raise BadInput(f"no node named {node_name} in the inventory",
                       hint="nodes: " + ", ".join(n.name for n in inventory.nodes))
    transport = open_transport(spec, **_transport_options(inventory, RunOptions()))
    try:
        yield transport
    finally:
        transport.close()


def _handle(inventory, transport):
    from sparkctl.plan.container import state_dir
    from sparkctl.tasks.serve_server import ServerHandle

    home = transport.run('printf %s "$HOME"', timeout=15).stdout.strip() or f"/home/{inventory.user}"
    return ServerHandle(transport.run, transport.put, inventory.container.name, state_dir(inventory, home))


@serve_group.command("presets")
def presets() -> None:
    """The models sparkctl knows how to serve, with their drafts and settings."""
    rows = [("preset", "model", "draft", "decoding", "draft len", "TP", "port", "weights")]
    for p in PRESETS.values():
        rows.append((p.name, p.model, p.draft or "-", p.decoding, str(p.max_draft_len or "-"), str(p.tp_size),
                     str(p.port), f"{p.weights_gb:g} GB"))
        rows += [(f"  :{variant}", "", draft, "", "", "", "", "") for variant, draft in p.variants.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    click.echo("\nserve.preset in the inventory; a variant picks another draft, e.g. gpt-oss-120b-eagle3:v2")


@serve_group.command("status")
@FILE
def status(file: str) -> None:
    """Endpoint, model, health, uptime and acceptance length (exit 1 when it is not healthy)."""
    inventory = load_inventory(file)
    url = _endpoint(inventory)
    client = ServeClient(url, timeout=10)
    health = client.health()
    rows = [("endpoint", url), ("health", "200 OK" if health == 200 else f"{health or 'no answer'}")]
    try:
        rows.append(("models", ", ".join(client.models()) or "-"))
    except EndpointError:
        rows.append(("models", "-"))
    rows.append(("version", client.version() or "-"))
    record = None
    try:
        with _connected(inventory, inventory.head.name) as transport:
            handle = _handle(inventory, transport)
            record = handle.read_record()
            alive = bool(record) and handle.alive(record.get("pid"))
    except SparkctlError as exc:
        rows.append(("head", f"not reachable over ssh: {exc.message}"))
        alive = False
    if record:
        uptime = time.time() - float(record.get("started") or time.time())
        rows += [("server", f"pid {record.get('pid')} in {inventory.container.name}"
                            f" ({'running' if alive else 'gone'})"),
                 ("uptime", _duration(uptime) if alive else "-"), ("config", record.get("fingerprint", "-"))]
    try:
        acceptance = acceptance_from_metrics(client.metrics()) if health == 200 else None
    except EndpointError:
        acceptance = None
    rows.append(("acceptance length", f"{acceptance:.2f}" if acceptance else "- (no requests since the last read)"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {redact_known(str(value))}")
    sys.exit(int(ExitStatus.SUCCESS if health == 200 else ExitStatus.TASK_FAILED))


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m{rest % 60:02d}s" if hours else f"{rest // 60}m{rest % 60:02d}s"


@serve_group.command("logs")
@FILE
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.option("--node", metavar="NODE", help="Read this node (default: the head, which holds serve.log).")
@click.option("-n", "--lines", type=click.IntRange(1, 100000), default=100, show_default=True)
def logs(file: str, follow: bool, node: str | None, lines: int) -> None:
    """The server's log (run/serve/serve.log on the head); on another node, its container's log."""
    from sparkctl.transport.base import q

    inventory = load_inventory(file)
    name = node or inventory.head.name
    with _connected(inventory, name) as transport:
        handle = _handle(inventory, transport)
        if name == inventory.head.name:
            path = handle.log_path
        else:
            path = None
            result = transport.run(f"docker logs --tail {lines} {q(inventory.container.name)} 2>&1", timeout=60)
            click.echo(redact_known(result.stdout), nl=False)
            if not follow:
                return
        if path is not None:
            result = transport.run(f"tail -n {lines} {q(path)} 2>/dev/null; wc -c < {q(path)} 2>/dev/null",
                                   timeout=60)
            *text, size = result.stdout.splitlines() or ["0"]
            if text:
                click.echo(redact_known("\n".join(text)))
            elif not size.strip().isdigit() or size.strip() == "0":
                click.echo(f"(no serve log on {name} yet: {path})", err=True)
        if follow:
            _follow(transport, path, inventory.container.name, int(size) if path and size.strip().isdigit() else 0)


def _follow(transport, path: str | None, container: str, offset: int) -> None:
    from sparkctl.transport.base import q

    since = int(time.time())
    try:
        while True:
            time.sleep(1.0)
            if path is None:
                now = int(time.time())
                out = transport.run(f"docker logs --since {since} --until {now} {q(container)} 2>&1", timeout=30)
                since = now
            else:
                out = transport.run(f"tail -c +{offset + 1} {q(path)} 2>/dev/null", timeout=30)
                if not out.stdout:
                    continue
                offset += len(out.stdout.encode())
            if out.stdout:
                click.echo(redact_known(out.stdout), nl=False)
    except KeyboardInterrupt:
        return


@serve_group.command("chat")
@FILE
@click.argument("prompt")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=256, show_default=True)
def chat(file: str, prompt: str, max_tokens: int) -> None:
    """One chat completion, streamed as it is generated."""
    inventory = load_inventory(file)
    client = ServeClient(_endpoint(inventory), timeout=600, model=inventory.serve_spec().model)
    try:
        reply = client.stream_chat(prompt, max_tokens=max_tokens,
                                   on_text=lambda t: (sys.stdout.write(t), sys.stdout.flush()))
    except EndpointError as exc:
        raise SparkctlError(str(exc), hint="`sparkctl serve status` and `sparkctl serve logs`") from exc
    click.echo()
    rate = reply.decode_tokens_per_s
    extra = [f"{reply.seconds:.1f}s"]
    if reply.ttft is not None:
        extra.append(f"TTFT {reply.ttft * 1000:.0f} ms")
    if rate:
        extra.append(f"{rate:.1f} tok/s decode")
    if reply.acceptance_length:
        extra.append(f"acceptance length {reply.acceptance_length:.2f}")
    click.echo("(" + ", ".join(extra) + ")", err=True)


@serve_group.command("bench")
@FILE
@click.option("--concurrency", default="1,4,8", show_default=True, help="Comma-separated concurrency levels.")
@click.option("--requests", type=click.IntRange(1, 100000), default=16, show_default=True,
              help="Requests per level (at least the concurrency).")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=128, show_default=True)
@click.option("--output", type=click.Path(dir_okay=False), default="serve-bench.json", show_default=True,
              help="Where to write the results as JSON.")
def bench(file: str, concurrency: str, requests: int, max_tokens: int, output: str) -> None:
    """Decode tokens/s per request and in aggregate, TTFT p50/p95 and acceptance length per concurrency."""
    from sparkctl.bench import parse_concurrency, run_bench

    try:
        levels = parse_concurrency(concurrency)
    except ValueError as exc:
        raise BadInput(f"--concurrency: {exc}") from exc
    inventory = load_inventory(file)
    url = _endpoint(inventory)
    client = ServeClient(url, timeout=600, model=inventory.serve_spec().model)
    if client.health() != 200:
        raise SparkctlError(f"{url} is not healthy", hint="`sparkctl serve status`")
    console = Console(highlight=False)
    results = run_bench(client, levels, requests, max_tokens,
                        on_level=lambda s: console.print(f"  concurrency {s.concurrency}: {s.requests} requests "
                                                         f"in {s.seconds:.1f}s", style="dim"))
    table = Table(box=None, pad_edge=False)
    for column in ("conc.", "requests", "failed", "decode tok/s/req", "aggregate tok/s", "TTFT p50 ms",
                   "TTFT p95 ms", "acceptance"):
        table.add_column(column, justify="right")
    for s in results:
        table.add_row(str(s.concurrency), str(s.requests), str(s.failed), _f(s.decode_tps_per_request),
                      _f(s.aggregate_tps), _f(s.ttft_p50, 1000), _f(s.ttft_p95, 1000), _f(s.acceptance_length))
    console.print(table)
    document = {"endpoint": url, "model": inventory.serve_spec().model, "max_tokens": max_tokens,
                "levels": [s.as_dict() for s in results]}
    with open(output, "w") as handle:
        json.dump(document, handle, indent=1)
    click.echo(f"written: {output}", err=True)
    if any(s.failed for s in results):
        sys.exit(int(ExitStatus.TASK_FAILED))


def _f(value: float | None, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.1f}"


@serve_group.command("stop")
@FILE
def stop(file: str) -> None:
    """Stop serving (mpirun and its ranks on every node); the containers stay. Bootstrap starts it again."""
    from sparkctl.tasks.serve_server import leftover_ranks_script
    from sparkctl.transport.base import q

    inventory = load_inventory(file)
    with _connected(inventory, inventory.head.name) as transport:
        handle = _handle(inventory, transport)
        record = handle.read_record() or {}
        stopped = handle.stop(record.get("pid"))
    leftovers = []
    for node in inventory.nodes:
        with _connected(inventory, node.name) as transport:
            line = f"docker exec {q(inventory.container.name)} sh -c {q(leftover_ranks_script())} 2>/dev/null; true"
            leftovers += transport.run(line, timeout=30).stdout.split()
    if stopped:
        click.echo(f"stopped the server (pid {record.get('pid')}) on {inventory.head.name}")
    else:
        click.echo("no server was running")
    if leftovers:
        click.echo(f"and {len(leftovers)} leftover rank(s)")
