"""The inference engines sparkctl serves with, and what each needs of the cluster: one entry per engine.

Shared code asks an engine what it needs (`needs_mpi`, `unit_per_rank`, `host_ip_env`...) and never compares
engine names: adding an engine is adding an entry here (docs/architecture.md, "Adding an engine"), not a branch in
every module that serves. What an engine knows of its own releases lives in sparkctl/knowledge (one module each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from sparkctl.knowledge import metric_names
from sparkctl.knowledge.metric_names import PrometheusNames

#: Every engine's name, as `serve.engine` spells it (the inventory's type: a misspelt name is refused at its line)
EngineName = Literal["trtllm", "vllm", "sglang"]


@dataclass(frozen=True, slots=True)
class Engine:
    name: EngineName
    #: the engine as people name it
    label: str
    #: the command a serving unit runs on a node, as `ps` shows it
    server: str
    #: the container a cluster gets when container.name / container.image are not written
    container_name: str
    container_image: str
    #: True: every serving node runs its own server (one rank each) under its own unit, and the ranks meet over the
    #: engine's own sockets; False: the head's unit runs mpirun, which starts the other ranks through the
    #: containers' sshd, mesh and hostfile
    unit_per_rank: bool
    #: the variable a rank advertises its own address with (unset, the engine takes the default route's: the
    #: management network, and the ranks hang after NCCL starts)
    host_ip_env: str | None = None
    #: variables naming the one interface of the engine's control traffic (Gloo, TensorPipe)
    control_ifname_envs: tuple[str, ...] = ()
    #: what every container of the engine gets besides the fabric's settings
    static_env: tuple[tuple[str, str], ...] = ()
    #: `docker run` arguments of its own, before the inventory's container.docker_args
    docker_args: tuple[str, ...] = ()
    #: what `serve.config` holds for it
    config_is: str = ""
    #: serve.config holds the server's flags by name (`max-model-len`; `_` read as `-`), not a config document
    config_flags: bool = False
    #: the names of the Prometheus text its `/metrics` answers with through the gateway (the collector's, for an
    #: engine whose own /metrics is drained on read)
    metrics: PrometheusNames = metric_names.VLLM
    #: its own /metrics is a queue each read empties (trtllm-serve's iteration stats): the head runs sparkctl's
    #: collector, the one reader, and the gateway's /metrics is the collector's cumulative counters
    metrics_drained: bool = False
    #: `serve.args` are the server's own flags (checked against the image's release); False: the engine takes
    #: none, its settings are `serve.config`
    takes_args: bool = True
    #: the serve: setting (`section.field`) of the head's port its ranks meet on; None: mpirun's (ports it picks)
    meeting_port: str | None = None

    @property
    def needs_mpi(self) -> bool:
        """The ranks are started by mpirun (the container sshd, the ssh mesh and the hostfile are its)."""
        return not self.unit_per_rank

    def own_settings(self) -> tuple[str, ...]:
        """The container variables only this engine reads (checked against the node by verify and doctor)."""
        return ((self.host_ip_env,) if self.host_ip_env else ()) + self.control_ifname_envs


# The images: TensorRT-LLM's is the release line of NVIDIA's two-Spark playbook; vLLM's the image of NVIDIA's
# two-Spark vLLM playbook line (nvcr.io/nvidia/vllm, 26.05-py3 = vLLM 0.20.1 per NVIDIA's vLLM release notes,
# docs.nvidia.com/deeplearning/frameworks/vllm-release-notes).
ENGINES: dict[EngineName, Engine] = {
    "trtllm": Engine(
        name="trtllm", label="TensorRT-LLM", server="mpirun",
        container_name="trtllm-multinode", container_image="nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12",
        unit_per_rank=False, config_is="its extra_llm_api_options keys", takes_args=False,
        # NVIDIA's two-Spark TensorRT-LLM playbook (nvidia/trt-llm/README.md): what its mpirun -x passes
        static_env=(("CPATH", "/usr/local/cuda/include"), ("TRITON_PTXAS_PATH", "/usr/local/cuda/bin/ptxas")),
        metrics=metric_names.TRTLLM_COLLECTED, metrics_drained=True),
    "vllm": Engine(
        name="vllm", label="vLLM", server="vllm serve",
        container_name="vllm-multinode", container_image="nvcr.io/nvidia/vllm:26.05-py3",
        unit_per_rank=True, config_is="its `vllm serve` flags, as in its --config file", config_flags=True,
        # vllm/envs.py: VLLM_HOST_IP; Gloo's and TensorPipe's interface (torch.distributed)
        host_ip_env="VLLM_HOST_IP", control_ifname_envs=("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"),
        # NVIDIA's two-Spark vLLM playbook (nvidia/vllm/README.md): Ray's memory monitor off
        static_env=(("RAY_memory_monitor_refresh_ms", "0"),), metrics=metric_names.VLLM,
        meeting_port="vllm.master_port"),
    "sglang": Engine(
        name="sglang", label="SGLang", server="sglang.launch_server",
        container_name="sglang-multinode", container_image="nvcr.io/nvidia/sglang:26.02-py3",
        unit_per_rank=True, config_is="its server's flags (`mem-fraction-static: 0.8`), on its command line",
        config_flags=True,
        # python/sglang/srt/server_args.py and utils: the rank's own address for the cross-node message queue
        # (SGLANG_HOST_IP, else HOST_IP, else the default route's interface); Gloo's interface (torch.distributed)
        host_ip_env="SGLANG_HOST_IP", control_ifname_envs=("GLOO_SOCKET_IFNAME",),
        # RDMA needs /dev/infiniband, unlimited memlock (every container has both) and the right to lock memory:
        # without them NCCL falls back to sockets, about 2.5x slower, and says so only in its INFO lines
        docker_args=("--cap-add", "IPC_LOCK"), metrics=metric_names.SGLANG, meeting_port="sglang.dist_port"),
}
assert set(ENGINES) == set(get_args(EngineName)), "every engine name has one entry"

#: serve.engine when neither it nor the preset says
DEFAULT_ENGINE: EngineName = "trtllm"


def engine(name: EngineName) -> Engine:
    return ENGINES[name]
