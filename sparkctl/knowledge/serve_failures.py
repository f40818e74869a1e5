"""PURE: the likely cause of a failed server start, from known signatures in its log (the troubleshooting tables
of NVIDIA/dgx-spark-playbooks nvidia/trt-llm/README.md and nvidia/speculative-decoding/README.md, and
TensorRT-LLM's, vLLM's and torch's own error messages)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str
    pattern: re.Pattern
    hint: str


#: vLLM's and torch's own messages (vllm at v0.20.1: vllm/v1/executor/ray_executor.py, ray_utils.py; argparse's
#: wording for `vllm serve`; torch/csrc/distributed/c10d/socket.cpp for the store client's retry warning)
VLLM_CAUSES = (
    Cause("flag refused", re.compile(r"vllm(?: serve)?: error: (?:unrecognized arguments|argument .*invalid "
                                          r"choice|ambiguous option|argument .*invalid)"),
          "the image's vLLM release refuses a flag or value of the launch: fix serve.args/serve.config in the "
          "inventory (`sparkctl inventory validate` checks them against the release the image tag names)"),
    Cause("ranks on one node", re.compile(r"Every node should have a unique IP address"),
          "two nodes said the same VLLM_HOST_IP (or Ray placed both ranks on one node): each container's "
          "VLLM_HOST_IP must be its own node's fabric address (rerun bootstrap: container.run)"),
    Cause("Ray missing", re.compile(r"Failed to import Ray|No module named 'ray'"),
          "serve.vllm.executor is ray and the image has no Ray: use an image with Ray (NVIDIA's vLLM images have "
          "it), or serve.vllm.executor: mp (vLLM 0.11.1 and later)"),
    Cause("rendezvous unreachable", re.compile(r"The client socket has failed to connect to"),
          "this rank cannot reach the master port on the head over the fabric: check the link between them and "
          "any firewall on the head (`sparkctl doctor`)"),
)

#: SGLang's own (python/sglang/launch_server.py parses with plain argparse, so its prog is launch_server.py) and
#: torch's store client, which --dist-init-addr's rendezvous is (torch/csrc/distributed/c10d/socket.cpp)
SGLANG_CAUSES = (
    Cause("flag refused", re.compile(r"launch_server(?:\.py)?: error: (?:unrecognized arguments|argument .*invalid "
                                     r"choice|ambiguous option|argument .*invalid|argument .*expected|"
                                     r"the following arguments are required)"),
          "the image's SGLang release refuses a flag or value of the launch: fix serve.args/serve.config in the "
          "inventory (`sparkctl inventory validate` checks them against the release the image tag names)"),
    Cause("rendezvous unreachable", re.compile(r"The client socket has failed to connect to"),
          "this rank cannot reach --dist-init-addr on the head over the fabric: check the link between them and "
          "any firewall on the head (`sparkctl doctor`)"),
)

CAUSES = (
    *VLLM_CAUSES,
    *SGLANG_CAUSES,
    Cause("unknown config key", re.compile(r"Extra inputs are not permitted|union_tag_invalid|validation error"),
          "the TensorRT-LLM config has a key (or value) this release rejects: {detail}; fix serve.config in the "
          "inventory"),
    # CUDA's own words (cudaErrorNoKernelImageForDevice) for a build without this GPU's architecture: GB10 is
    # sm_121, which an engine built for older GPUs (or a generic arm64 wheel) lacks; torch adds the second line
    Cause("no kernels for this GPU", re.compile(r"no kernel image is available for execution on the device"),
          "the image's engine was not built for the Spark's GPU (GB10, sm_121): use a release image built for "
          "DGX Spark, or go back to the one that served (bootstrap rolls a failed switch back; `sparkctl serve "
          "rollback` by hand)"),
    Cause("out of memory", re.compile(r"CUDA out of memory|OutOfMemoryError|out of memory|Cannot allocate memory",
                                      re.I),
          "the model, draft and KV cache do not fit: lower kv_cache_config.free_gpu_memory_fraction in "
          "serve.config, drop the page cache on each node (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`), "
          "or use more nodes (tp_size)"),
    Cause("port in use", re.compile(r"address already in use|error while attempting to bind", re.I),
          "another process holds the serve port on the head: stop it or set serve.port"),
    Cause("missing model files", re.compile(
        r"does not appear to have (?:the files|a file named)|couldn't find them in the cached files|"
        r"Incorrect path_or_model_id|Cannot find any model weights|"
        r"No such file or directory: '.*(config\.json|safetensors)"),
          "the model or draft is not complete in the HF cache on every node: rerun bootstrap (model.fetch)"),
    Cause("gated model", re.compile(r"GatedRepoError|Cannot access gated repo"),
          "a gated repo needs a token: export the variable named by serve.hf_token_env and rerun"),
    Cause("NCCL", re.compile(r"NCCL WARN|NCCL error|unhandled system error"),
          "NCCL could not use the fabric settings: check NCCL_SOCKET_IFNAME/NCCL_IB_HCA against each node's Up "
          "interfaces (`sparkctl doctor`, verify.fabric)"),
    Cause("MPI start-up", re.compile(r"ORTE was unable to reliably start|Connection refused|"
                                     r"Permission denied \(publickey\)|PRTE has lost communication"),
          "mpirun could not start ranks on the peers: the container sshd or keys (rerun bootstrap: "
          "container.ssh, mpi.hostfile)"),
    Cause("ranks vs tp_size", re.compile(r"MPI world size|world size is \d+"),
          "tp_size must equal the number of ranks (one per node in the hostfile)"),
    Cause("peer lost", re.compile(r"a peer rank is unreachable|did not complete within"),
          "a rank on another node stopped answering: check the fabric link and that node's container"),
)


def likely_cause(lines: list[str]) -> tuple[str, str] | None:
    """(cause name, hint) for the first known signature in the log lines, most specific first."""
    text = "\n".join(lines)
    for cause in CAUSES:
        m = cause.pattern.search(text)
        if m:
            return cause.name, cause.hint.format(detail=_config_detail(lines) or "see the log")
    return None


def _config_detail(lines: list[str]) -> str | None:
    """The key pydantic names in the line before `Extra inputs are not permitted`."""
    for before, line in zip(lines, lines[1:], strict=False):
        if "Extra inputs are not permitted" in line and before.strip():
            return f"`{before.strip()}` is not accepted"
    return None
