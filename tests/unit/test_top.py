"""`sparkctl top`: the node read run for real against files laid out as a node's /proc and /sys, the serving
figures of both engines, a frame through the documented event schema and through Prometheus' own parser, a node
that stops answering, and the command line's refusals."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sparkctl.cli.json_schema import validate_line
from sparkctl.cli.main import cli
from sparkctl.plan.top import END, NodeRead, Twin, agent_script
from sparkctl.runs.top import Frame, LinkFigures, NodeFigures, Top, _Reading
from sparkctl.runs.top_exporter import FrameCollector, serve_metrics
from sparkctl.transport.framing import Framing

REPO = Path(__file__).resolve().parents[2]


def fake_node(tmp_path: Path) -> Path:
    """A node's /proc/stat, /proc/meminfo and one twin's netdev and RoCE counters under tmp_path."""
    root = tmp_path / "node"
    stats = root / "sys/class/net/enp1s0f1np1/statistics"
    stats.mkdir(parents=True)
    for name, value in {"rx_bytes": 1000, "tx_bytes": 2000, "rx_errors": 1, "tx_errors": 0, "rx_dropped": 0,
                        "tx_dropped": 3}.items():
        (stats / name).write_text(f"{value}\n")
    counters = root / "sys/class/infiniband/rocep1s0f1/ports/1/counters"
    counters.mkdir(parents=True)
    (counters / "port_rcv_data").write_text("250\n")
    (counters / "port_xmit_data").write_text("500\n")
    return root


def test_the_node_agent_answers_each_refresh_with_sections_that_parse(tmp_path):
    """The agent run for real (bash, as Transport.hold starts it) against files laid out as a node's /sys: the key
    first, then one line per refresh; docker only when asked; the key never on a command line."""
    root = fake_node(tmp_path)
    framing = Framing()
    read = NodeRead(twins=(Twin("enp1s0f1np1", "rocep1s0f1"), Twin("enP7s7", None)), container="trtllm-multinode",
                    metrics_url="http://127.0.0.1:9/metrics", authorized=True)
    script = agent_script(read, framing, 2.0).replace("/sys/class", f"{root}/sys/class")
    assert "Bearer" not in script and '_metrics 127.0.0.1 9 /metrics "$_auth"' in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text("#!/bin/sh\necho \"$*\" >> \"$DOCKER_LOG\"\necho 'running 1'\n")
    (bin_dir / "docker").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DOCKER_LOG": str(tmp_path / "docker.log")}
    out = subprocess.run(["bash", "-c", script], input="Authorization: Bearer k\nc\n-\n", capture_output=True,
                         text=True, timeout=30, env=env).stdout
    answers = out.split(END + "\n")
    assert len(answers) == 3 and answers[2] == ""  # two refreshes, then the agent ended with its stdin
    first, second = (framing.texts(a) for a in answers[:2])
    assert first["links"].splitlines()[0] == "netdev enp1s0f1np1 1000 2000 1 0 0 3"
    assert first["links"].splitlines()[1] == "roce enp1s0f1np1 250 500"
    assert first["links"].splitlines()[2].startswith("netdev enP7s7 x x")  # not on this machine
    reading = Top._parse(first)
    link = reading.links["enp1s0f1np1"]
    assert (link.rx_bytes, link.tx_bytes, link.errors, link.dropped, link.rdma) == (1000, 2000, 1, 3, True)
    assert reading.container == "running" and reading.container_pid == 1   # PID 1 of this test's namespace
    assert reading.cpu is not None and reading.mem is not None and reading.mem.total_kib > 0
    assert Top._parse(second).container == "running"  # from /proc, docker not asked again
    assert (tmp_path / "docker.log").read_text().count("inspect") == 1
    assert reading.metrics_status == 0  # nothing listens on port 9


def frame() -> Frame:
    links = [LinkFigures("enp1s0f1np1", 12.5, 11.0, 0, 0, "rdma", "fabric", True),
             LinkFigures("enP7s7", 0.001, 0.002, 0, 0, "netdev", "management")]
    nodes = [NodeFigures("spark1", True, gpu_util_pct=87.0, gpu_temp_c=63.0, gpu_power_w=71.5, cpu_pct=12.0,
                         mem_used_gib=98.0, mem_total_gib=119.7, container="running", links=links),
             NodeFigures("spark2", False, why="spark2 did not answer within 10 s")]
    serving = {"engine": "vllm", "metrics_status": 200, "running": 3.0, "waiting": 0.0, "prompt_tps": 410.0,
               "generation_tps": 96.5, "ttft_p50_s": 0.21, "kv_cache_fraction": 0.18, "acceptance": 0.71}
    return Frame("spark-pair", 2.004, nodes, serving)


def test_a_frame_is_a_documented_event_line():
    line = {"schema": 1, "time": "2026-11-28T04:00:00.000Z", "event": "top", **frame().to_dict()}
    validate_line(line)
    assert line["nodes"]["spark2"] == {**line["nodes"]["spark2"], "answering": False}


def test_the_exporter_serves_the_same_figures_in_prometheus_format():
    collector = FrameCollector()
    collector.update(frame())
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = {s.labels["node"]: s.value for s in families["sparkctl_node_up"].samples}
    assert up == {"spark1": 1.0, "spark2": 0.0}
    rx = [s for s in families["sparkctl_link_receive_gigabits_per_second"].samples
          if s.labels["interface"] == "enp1s0f1np1"]
    assert rx[0].value == 12.5 and rx[0].labels == {"cluster": "spark-pair", "node": "spark1",
                                                     "interface": "enp1s0f1np1", "role": "fabric", "nccl": "1"}
    assert families["sparkctl_serve_generation_tokens_per_second"].samples[0].value == 96.5
    assert families["sparkctl_gpu_utilization_percent"].samples[0].labels == {"cluster": "spark-pair",
                                                                              "node": "spark1"}


def test_the_exporter_carries_every_world_s_figures_by_its_model():
    several = frame()
    assert several.serving is not None
    several.worlds = [{"model": "llama", **several.serving},
                      {"model": "oss #2", **several.serving, "generation_tps": 40.0, "acceptance": None}]
    collector = FrameCollector()
    collector.update(several)
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    generated = {s.labels["model"]: s.value for s in families["sparkctl_serve_generation_tokens_per_second"].samples}
    assert generated == {"llama": 96.5, "oss #2": 40.0}
    assert [s.labels["model"] for s in families["sparkctl_serve_speculative_acceptance_ratio"].samples] == ["llama"]
    # the one world of a cluster: no model's name
    collector.update(frame())
    (sample,) = [s for f in text_string_to_metric_families(generate_latest(registry).decode())
                 if f.name == "sparkctl_serve_generation_tokens_per_second" for s in f.samples]
    assert sample.labels == {"cluster": "spark-pair", "engine": "vllm", "model": ""}


def test_the_exporter_listens_where_asked_and_answers_a_scrape():
    collector, port = serve_metrics("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert "sparkctl_node_up" not in response.read().decode()  # nothing before the first refresh
    collector.update(frame())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'sparkctl_node_up{cluster="spark-pair",node="spark2"} 0.0' in text


def test_a_node_that_stops_answering_is_shown_and_the_others_go_on(monkeypatch):
    class Session:
        forks, unreachable, transports = 4, {}, {}

    top = Top.__new__(Top)
    top.nodes, top.count, top.last, top.lost, top.engine = ["spark1", "spark2"], 0, {}, {}, None
    top.nccl_twins, top.twins, top.management = {}, {"spark1": (), "spark2": ()}, {"spark1": (), "spark2": ()}
    top.session, top.serve_before, top.agents = Session(), None, {}
    top.inventory = type("Inv", (), {"cluster": type("C", (), {"name": "duo"})(),
                                     "head": type("H", (), {"name": "spark1"})()})()
    from concurrent.futures import ThreadPoolExecutor

    top.pool = ThreadPoolExecutor(2)

    def read(name):
        if name == "spark2":
            raise OSError("spark2 stopped answering")
        return _Reading(at=1.0, container="running")

    monkeypatch.setattr(top, "_read", read)
    shown = top.refresh()
    assert [(n.node, n.answering) for n in shown.nodes] == [("spark1", True), ("spark2", False)]
    assert "stopped answering" in shown.nodes[1].why and top.lost == {"spark2": "spark2 stopped answering"}
    top.refresh()  # not asked again until the next RECONNECT_EVERY
    assert top.count == 2


def test_the_command_line_refuses_a_bad_metrics_address_with_exit_2():
    inventory = str(REPO / "inventories" / "two-sparks.yaml")
    result = CliRunner().invoke(cli, ["top", inventory, "--serve-metrics", "nowhere"])
    assert result.exit_code == 2 and "expected HOST:PORT" in result.output


def test_the_grafana_dashboard_and_scrape_config_name_metrics_the_exporter_writes():
    dashboard = json.loads((REPO / "docs" / "grafana-top.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    written = {f"sparkctl_{name}" for name, _ in _all_gauges()} | {"sparkctl_node_up"}
    for query in queries:
        names = {w for w in written if w in query}
        assert names, query
    assert "sparkctl top" in (REPO / "docs" / "top.md").read_text()
    assert "scrape_configs" in (REPO / "docs" / "top.md").read_text()


def _all_gauges():
    from sparkctl.runs.top_exporter import LINK_GAUGES, NODE_GAUGES, SERVING_GAUGES

    return [*NODE_GAUGES.values(), *LINK_GAUGES.values(), *SERVING_GAUGES.values()]


def test_the_agent_reads_the_metrics_with_the_key_it_was_given_first_and_nothing_else_does(tmp_path):
    """The metrics over bash's /dev/tcp (no curl each refresh): the key, given once on the agent's stdin, goes in
    the request's header; a wrong or missing one gets the gateway's 401."""
    import http.server
    import threading

    class Gateway(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            ok = self.headers.get("Authorization") == "Bearer k3y" and self.path == "/metrics"
            body = b"vllm:num_requests_running 2.0\nvllm:num_requests_waiting 1.0\n" if ok else b"no"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        read = NodeRead((), "c", metrics_url=f"http://127.0.0.1:{server.server_address[1]}/metrics", authorized=True)
        answers = {}
        for key in ("Authorization: Bearer k3y", "Authorization: Bearer wrong"):
            framing = Framing()
            out = subprocess.run(["bash", "-c", agent_script(read, framing, 2.0)], input=f"{key}\n-\n",
                                 capture_output=True, text=True, timeout=30).stdout
            answers[key] = Top._parse(framing.texts(out.split(END)[0]))
    finally:
        server.shutdown()
    good = answers["Authorization: Bearer k3y"]
    assert good.metrics_status == 200 and "vllm:num_requests_running 2.0" in (good.metrics or "")
    assert answers["Authorization: Bearer wrong"].metrics_status == 401
    assert Top._parse({"nccl": ""}).nccl is None  # not asked this refresh: the marks stay as they were


def test_with_several_worlds_each_engine_s_metrics_is_read_on_its_head_without_the_key():
    """A node that heads another world also reads that world's engine /metrics where it answers, no key sent (the
    gateway is not in the way); each comes back under its world's section."""
    import http.server
    import threading

    seen: list[str | None] = []

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            seen.append(self.headers.get("Authorization"))
            body = b"vllm:num_requests_running 3.0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        read = NodeRead((), "c", engines=(("small", url), ("oss-2", "http://127.0.0.1:9/metrics")))
        framing = Framing()
        out = subprocess.run(["bash", "-c", agent_script(read, framing, 2.0)], input="Authorization: Bearer k\n-\n",
                             capture_output=True, text=True, timeout=30).stdout
        reading = Top._parse(framing.texts(out.split(END)[0]))
    finally:
        server.shutdown()
    assert reading.metrics_status == 0 and reading.metrics is None  # no gateway read on this node
    assert reading.engines["small"] == (200, "vllm:num_requests_running 3.0\n")
    assert reading.engines["oss-2"] == (0, None)  # nothing answers there
    assert seen == [None]


def test_the_acceptance_length_is_each_engine_s_own():
    """serve status and serve bench: between two readings of the counters, 1 + accepted tokens / speculative steps
    as vLLM's own log says it (spec_decode/metrics.py); TensorRT-LLM's are the collector's counters."""
    from sparkctl.knowledge import metric_names
    from sparkctl.knowledge.serve_metrics import ServeSample, acceptance_since, metrics_reading

    # TensorRT-LLM's through the collector: the same counters, sparkctl's names
    trt = metrics_reading("# TYPE sparkctl_trtllm_spec_decode_num_drafts_total counter\n"
                          "sparkctl_trtllm_spec_decode_num_drafts_total 2.0\n"
                          "# TYPE sparkctl_trtllm_spec_decode_num_accepted_tokens_total counter\n"
                          "sparkctl_trtllm_spec_decode_num_accepted_tokens_total 4.0\n", metric_names.TRTLLM_COLLECTED)
    assert acceptance_since(None, trt) == 3.0
    # as prometheus_client writes a counter (its TYPE line names the sample, `_total` included)
    text = ("# TYPE vllm:spec_decode_num_drafts_total counter\n"
            "vllm:spec_decode_num_drafts_total{engine=\"0\"} 40.0\n"
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
            "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\"} 70.0\n")
    now = metrics_reading(text, metric_names.VLLM)
    assert isinstance(now, ServeSample) and now.drafts == 40.0
    assert acceptance_since(None, now) == 2.75  # since the engine started
    assert acceptance_since(ServeSample(drafts=20.0, accepted_tokens=30.0), now) == 3.0  # 1 + 40 / 20
    assert acceptance_since(now, now) is None  # no speculative step in between
