"""`sparkctl top --serve-metrics HOST:PORT`: the same figures as the view, in the Prometheus exposition format,
written by the official client library (prometheus_client) from the latest refresh, labelled by cluster, node and
interface, and the serving figures by engine and model (every world's, with several)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sparkctl.runs.top import Frame

PREFIX = "sparkctl"

#: node figure -> (metric, help)
NODE_GAUGES = {
    "gpu_util_pct": ("gpu_utilization_percent", "GPU utilisation, percent (nvidia-smi utilization.gpu)"),
    "gpu_temp_c": ("gpu_temperature_celsius", "GPU temperature (nvidia-smi temperature.gpu)"),
    "gpu_power_w": ("gpu_power_watts", "GPU power draw (nvidia-smi power.draw)"),
    "cpu_pct": ("cpu_busy_percent", "share of all CPUs busy since the last refresh (/proc/stat)"),
    "mem_used_gib": ("memory_used_gibibytes", "memory in use, MemTotal - MemAvailable (unified on a Spark)"),
    "mem_total_gib": ("memory_total_gibibytes", "MemTotal"),
}
#: link figure -> (metric, help)
LINK_GAUGES = {
    "rx_gbps": ("link_receive_gigabits_per_second", "received, Gb/s, since the last refresh (the RoCE port's "
                                                    "counters where the twin has them, RDMA included)"),
    "tx_gbps": ("link_transmit_gigabits_per_second", "sent, Gb/s, since the last refresh"),
    "errors": ("link_errors", "receive and transmit errors since the last refresh"),
    "drops": ("link_drops", "receive and transmit drops since the last refresh"),
}
#: serving figure -> (metric, help)
SERVING_GAUGES = {
    "running": ("serve_requests_running", "requests the engine is running"),
    "waiting": ("serve_requests_waiting", "requests waiting for the engine"),
    "prompt_tps": ("serve_prompt_tokens_per_second", "prompt tokens per second since the last refresh"),
    "generation_tps": ("serve_generation_tokens_per_second", "generated tokens per second since the last refresh"),
    "ttft_p50_s": ("serve_time_to_first_token_p50_seconds", "median time to first token since the last refresh"),
    "kv_cache_fraction": ("serve_kv_cache_usage_ratio", "KV cache in use, 0-1"),
    "acceptance": ("serve_speculative_acceptance_ratio", "accepted / drafted tokens since the last refresh"),
}


class FrameCollector(Collector):
    """Yields the latest frame's figures at each scrape (nothing before the first refresh)."""

    def __init__(self) -> None:
        self._frame: Frame | None = None
        self._lock = threading.Lock()

    def update(self, frame: Frame) -> None:
        with self._lock:
            self._frame = frame

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            frame = self._frame
        if frame is None:
            return
        cluster = frame.cluster
        up = GaugeMetricFamily(f"{PREFIX}_node_up", "1 when the node answered the last refresh",
                               labels=["cluster", "node"])
        for node in frame.nodes:
            up.add_metric([cluster, node.node], 1.0 if node.answering else 0.0)
        yield up
        for field, (name, text) in NODE_GAUGES.items():
            family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["cluster", "node"])
            for node in frame.nodes:
                value = getattr(node, field)
                if node.answering and value is not None:
                    family.add_metric([cluster, node.node], float(value))
            yield family
        for field, (name, text) in LINK_GAUGES.items():
            family = GaugeMetricFamily(f"{PREFIX}_{name}", text,
                                       labels=["cluster", "node", "interface", "role", "nccl"])
            for node in frame.nodes:
                for link in node.links:
                    value = getattr(link, field)
                    if value is not None:
                        family.add_metric([cluster, node.node, link.interface, link.role,
                                           "1" if link.nccl else "0"], float(value))
            yield family
        # with several worlds, each one's figures by its model's name (empty for the one world of a cluster)
        worlds = frame.worlds or ([frame.serving] if frame.serving else [])
        for field, (name, text) in SERVING_GAUGES.items():
            family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["cluster", "engine", "model"])
            for world in worlds:
                value = world.get(field)
                if value is not None:
                    family.add_metric([cluster, str(world.get("engine", "")), str(world.get("model", ""))],
                                      float(value))
            yield family


def serve_metrics(host: str, port: int) -> tuple[FrameCollector, int]:
    """Start the exporter on HOST:PORT (a thread of this process; port 0: a free one); what to give each frame to,
    and the port it listens on."""
    registry = CollectorRegistry(auto_describe=False)
    collector = FrameCollector()
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return collector, int(server.server_port)
