"""`sparkctl serve ...`: presets, status, logs, chat, bench, stop — the everyday commands for the endpoint."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone

import click

from sparkctl.cli.options import build_request, csv_set, load, run_view, whole_cluster_run_options
from sparkctl.cli.report import STDOUT, json_option, output_file, print_table, report_line, verbose_option
from sparkctl.errors import BadInput, SparkctlError
from sparkctl.exitcodes import ExitStatus
from sparkctl.inventory.presets import PRESETS
from sparkctl.knowledge.serve_client import EndpointError
from sparkctl.runs.session import check_limit
from sparkctl.secrets import redact_known

FILE = click.argument("file", type=click.Path())


def _write_now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@click.group("serve")
def serve_group() -> None:
    """The OpenAI-compatible endpoint `cluster bootstrap` starts: status, logs, chat, bench, stop."""


@serve_group.command("presets")
@json_option
@verbose_option
def presets(as_json: bool, verbose: int) -> None:
    """The models sparkctl knows how to serve, with their drafts and settings."""
    if as_json:
        report_line("serve presets", ExitStatus.SUCCESS, presets=[
            {"name": p.name, "engine": p.engine, "model": p.model, "draft": p.draft, "decoding": p.decoding,
             "max_draft_len": p.max_draft_len, "tp_size": p.tp_size, "port": p.port, "weights_gb": p.weights_gb,
             "variants": dict(p.variants)} for p in PRESETS.values()])
        return
    rows: list[tuple[str, ...]] = []
    for p in PRESETS.values():
        rows.append((p.name, p.engine, p.model, p.draft or "-", p.decoding, str(p.max_draft_len or "-"),
                     str(p.tp_size), str(p.port), f"{p.weights_gb:g} GB"))
        rows += [(f"  :{variant}", "", "", draft, "", "", "", "", "") for variant, draft in p.variants.items()]
    print_table(None, ("preset", "engine", "model", "draft", "decoding", "draft len", "TP", "port", "weights"), rows)
    click.echo("\nserve.preset in the inventory names one;\na variant picks another draft, e.g. gpt-oss-120b-eagle3:v2")


@serve_group.command("status")
@FILE
@json_option
@verbose_option
def status(file: str, as_json: bool, verbose: int) -> None:
    """Endpoint, model, health, uptime and acceptance length (exit 1 when it is not healthy)."""
    from sparkctl.runs.serve_ops import serve_status

    report = serve_status(load(file))
    exit_status = ExitStatus.SUCCESS if report.healthy else ExitStatus.TASK_FAILED
    if as_json:
        report_line("serve status", exit_status, healthy=report.healthy, rows=dict(report.rows))
        sys.exit(int(exit_status))
    width = max(len(k) for k, _ in report.rows)
    for key, value in report.rows:
        click.echo(f"{key:<{width}}  {redact_known(str(value))}")
    sys.exit(int(ExitStatus.SUCCESS if report.healthy else ExitStatus.TASK_FAILED))


@serve_group.command("key")
@FILE
@click.option("--rotate", is_flag=True, help="Make a new key and put it on the gateway: the old one gets 401 at once.")
@json_option
@verbose_option
def key(file: str, rotate: bool, as_json: bool, verbose: int) -> None:
    """Print the endpoint's API key (clients send `Authorization: Bearer <key>`); --rotate replaces it."""
    from sparkctl.runs.serve_ops import endpoint_key, rotate_key

    inventory = load(file)
    if inventory.serve.auth == "none":
        raise BadInput(f"{file}: serve.auth is none: the endpoint takes no key",
                       hint="remove `auth: none` from serve: and run `sparkctl cluster bootstrap` to lock it")
    if rotate:
        with run_view({"as_json": as_json, "verbose": verbose, "diff": False}) as view:
            result = rotate_key(inventory, verbose, view)
        if result.exit_status() != ExitStatus.SUCCESS:
            sys.exit(int(result.exit_status()))
    value = endpoint_key(inventory)
    if value is None:
        raise SparkctlError("the endpoint has no key yet: the first serving `sparkctl cluster bootstrap` makes one")
    if as_json:
        # the one place the key is printed on purpose: what a script asked for
        click.echo(json.dumps({"event": "serve key", "status": 0, "key": value}))
        return
    click.echo(value)


@serve_group.command("rollback")
@FILE
@whole_cluster_run_options
def rollback(file: str, **params) -> None:
    """Go back to the previous deployment the head keeps (image, engine config, model revision): its containers,
    config, units and gateway are put back and smoke-tested. The inventory is left as it is, so the next bootstrap
    switches to what it names again."""
    from sparkctl.runs.rollback import roll_back

    inventory = load(file)
    rolled = roll_back(inventory, build_request(params), lambda: run_view(params))
    sys.exit(int(rolled.result.exit_status()))


@serve_group.command("logs")
@FILE
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (Ctrl-C to stop).")
@click.option("--limit", "limit", metavar="NODE", help="Read this node (default: the head, which holds serve.log).")
@click.option("--node", metavar="NODE", hidden=True, help="The same as --limit (kept for old scripts).")
@click.option("-n", "--lines", type=click.IntRange(1, 100000), default=100, show_default=True)
@click.option("--model", "model", metavar="NAME", help="The world of this model, by its name or an alias (default: "
                                                       "the first of serve.models; a replica's: the first).")
@verbose_option
def logs(file: str, follow: bool, limit: str | None, node: str | None, lines: int, model: str | None,
         verbose: int) -> None:
    """The server's log (run/serve/serve.log on the world's head); on another node (--limit), its container's log."""
    from sparkctl.runs.serve_ops import connected, follow_log, read_log, world_of

    whole = load(file)
    inventory = world_of(whole, model)
    limit = limit or node
    chosen = csv_set(limit) or set()
    if len(chosen) > 1:
        raise BadInput(f"--limit {limit}: one node at a time", hint="run serve logs once per node")
    check_limit(inventory, chosen or None)
    name = next(iter(chosen), None) or inventory.serving_nodes()[0]
    with connected(inventory, name) as transport:
        log = read_log(inventory, transport, name, lines)
        if log.text:
            click.echo(redact_known(log.text), nl=False)
        elif log.missing:
            click.echo(f"(no serve log on {name} yet: {log.path})", err=True)
        if not follow:
            return
        try:
            for text in follow_log(transport, inventory.container.name, log):
                click.echo(redact_known(text), nl=False)
        except KeyboardInterrupt:
            return


@serve_group.command("chat")
@FILE
@click.argument("prompt")
@click.option("--max-tokens", type=click.IntRange(1, 32768), default=256, show_default=True)
@click.option("--model", "model", metavar="NAME", help="The model to ask, by its name or an alias (default: the "
                                                       "first of serve.models).")
@verbose_option
def chat(file: str, prompt: str, max_tokens: int, model: str | None, verbose: int) -> None:
    """One chat completion, streamed as it is generated."""
    from sparkctl.runs.serve_ops import endpoint_client

    inventory = load(file)
    with endpoint_client(inventory, timeout=600, model=model) as client:
        if not client.streams:
            click.echo(f"(not reachable from here: asking {client.base_url}, not streamed)", err=True)
        try:
            reply = client.stream_chat(prompt, max_tokens=max_tokens,
                                       on_text=_write_now)
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
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Also write the results as JSON here ('-': stdout, the table then goes to stderr). They are always "
                   "recorded with the cluster's other records ($XDG_STATE_HOME/sparkctl/serve-bench/<cluster>/).")
@click.option("--model", "model", metavar="NAME", help="The model to measure, by its name or an alias (default: the "
                                                       "first of serve.models).")
@json_option
@verbose_option
def bench(file: str, concurrency: str, requests: int, max_tokens: int, output: str | None, model: str | None,
          as_json: bool, verbose: int) -> None:
    """Decode tokens/s per request and in aggregate, TTFT p50/p95 and acceptance length per concurrency.

    Exit 0 when every request answered, 1 when one failed. With --json: one `report` line (docs/events.md).
    """
    from sparkctl.knowledge.bench import parse_concurrency, run_bench
    from sparkctl.runs.bench_records import record_bench
    from sparkctl.runs.outputs import check_writable
    from sparkctl.runs.serve_ops import endpoint_client, served_name

    if output == STDOUT and as_json:
        raise BadInput("-o - and --json both want stdout", hint="write the results to a file with -o FILE")
    try:
        levels = parse_concurrency(concurrency)
    except ValueError as exc:
        raise BadInput(f"--concurrency: {exc}") from exc
    if output is not None and output != STDOUT:
        check_writable(output, "--output")
    inventory = load(file, warn=not as_json)
    name = served_name(inventory, model)
    served = next(m for m in inventory.served_models() if name in (m.name, *m.aliases))
    # the gateway's /metrics?model=NAME: the model's own figures (its first world's)
    metrics = inventory.engine().metrics
    with endpoint_client(inventory, timeout=600, direct_only=True, model=name) as client:
        url = client.base_url
        results = run_bench(client, levels, requests, max_tokens,
                            on_level=lambda s: click.echo(f"  concurrency {s.concurrency}: {s.requests} requests in "
                                                          f"{s.seconds:.1f}s", err=True),
                            metrics=metrics)
    document = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "endpoint": url,
                "model": served.spec.model, "name": served.name, "engine": inventory.engine().name,
                "max_tokens": max_tokens, "levels": [s.as_dict() for s in results]}
    try:
        recorded = record_bench(inventory.cluster.name, document, kind="serve-bench")
    except OSError as exc:
        raise SparkctlError(f"cannot record the results: {exc}") from exc
    if output is not None:
        try:
            with output_file(output, "--output") as handle:
                handle.write(json.dumps(document, indent=1) + "\n")
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise SparkctlError(f"cannot write {output}: {exc.strerror}") from exc
    exit_status = ExitStatus.TASK_FAILED if any(s.failed for s in results) else ExitStatus.SUCCESS
    if as_json:
        report_line("serve bench", exit_status, **document, output=output, recorded=str(recorded))
        sys.exit(int(exit_status))
    print_table(None, BENCH_HEADERS, [
        (str(s.concurrency), str(s.requests), str(s.failed), _f(s.decode_tps_per_request), _f(s.aggregate_tps),
         _f(s.ttft_p50, 1000), _f(s.ttft_p95, 1000), _f(s.acceptance_length)) for s in results], err=output == STDOUT)
    click.echo(f"recorded: {recorded}", err=True)
    if output is not None and output != STDOUT:
        click.echo(f"written: {output}", err=True)
    sys.exit(int(exit_status))


BENCH_HEADERS = ("conc.", "requests", "failed", "decode tok/s/req", "aggregate tok/s", "TTFT p50 ms", "TTFT p95 ms",
                 "acceptance")


def _f(value: float | None, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.1f}"


@serve_group.command("stop")
@FILE
@json_option
@verbose_option
def stop(file: str, as_json: bool, verbose: int) -> None:
    """Stop serving (every model's world: mpirun and its ranks on every node); the containers stay. Bootstrap starts
    it again.

    No --limit: mpirun on the head takes down the ranks of every node it launched (one TP/PP world does not stop
    in part), and leftover ranks are looked for on every reachable node.
    """
    from sparkctl.runs.serve_ops import stop_server

    inventory = load(file)
    result = stop_server(inventory)
    if as_json:
        report_line("serve stop", ExitStatus.SUCCESS, stopped_pid=result.pid, leftovers=result.leftovers,
                    unreachable=result.unreachable)
        return
    if result.pid is not None:
        click.echo(f"stopped the server (pid {result.pid}) on {inventory.head.name}")
    else:
        click.echo("no server was running")
    if result.leftovers:
        click.echo(f"and {len(result.leftovers)} leftover rank(s)")
    for node, why in result.unreachable.items():
        click.echo(f"{node}: not reachable, leftover ranks not checked: {redact_known(why)}", err=True)
