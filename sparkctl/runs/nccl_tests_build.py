"""nccl-tests' all_reduce_perf built in every node's container when the image lacks it (plan/nccl_tests.py): once
per node and image, all nodes at once, with a progress line per node."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sparkctl.facts import Facts
from sparkctl.plan.nccl_tests import (
    BUILD_TIMEOUT,
    NCCL_TESTS_TAG,
    build_error,
    build_outcome,
    build_script,
    cache_key,
    cached_binary,
)
from sparkctl.taskgraph.runner import DEFAULT_FORKS
from sparkctl.transport.base import Transport, q


def _build_on(transport: Transport, node: str, container: str, image_id: str,
              progress: Callable[[str], None]) -> tuple[str, str]:
    progress(f"{node}: nccl-tests {NCCL_TESTS_TAG} for this image (cached under the node's sparkctl state; the "
             "first time it is built, which takes minutes)")
    result = transport.exec_in(container, f"bash -c {q(build_script(image_id))}", timeout=BUILD_TIMEOUT)
    kind, detail = build_outcome(result.stdout + result.stderr)
    if kind == "unknown" and result.timed_out:
        detail = f"the build did not finish within {BUILD_TIMEOUT:g} s"
    progress(f"{node}: nccl-tests {'ready' if kind == 'ready' else 'not built'}")
    return kind, detail


def build_all_reduce_perf(transports: dict[str, Transport], container: str, facts: dict[str, Facts],
                          order: list[str], *, forks: int = DEFAULT_FORKS,
                          progress: Callable[[str], None] = lambda _: None) -> tuple[str | None, str]:
    """(all_reduce_perf's path in every container, "") once built or found in the cache on every node, else
    (None, why not: the node and what is missing)."""
    images = {n: (c.image_id if (c := facts[n].containers.get(container)) is not None else None) for n in order}
    absent = [n for n, i in images.items() if not i]
    if absent:
        return None, (f"it cannot be built: no {container} container on {', '.join(absent)} (sparkctl cluster "
                      "bootstrap starts the containers)")
    if len(set(images.values())) > 1:
        return None, ("it cannot be built once for all: the containers run different images ("
                      + ", ".join(f"{n} {str(i)[:19]}" for n, i in images.items()) + ")")
    image_id = str(images[order[0]])
    try:
        cache_key(image_id)
    except ValueError as exc:
        return None, f"it cannot be built: {exc}"
    with ThreadPoolExecutor(max_workers=max(1, min(forks, len(order)))) as pool:
        outcomes = dict(zip(order, pool.map(lambda n: _build_on(transports[n], n, container, image_id, progress),
                                            order), strict=True))
    failed = [build_error(n, kind, detail) for n, (kind, detail) in outcomes.items() if kind != "ready"]
    return (None, "; ".join(failed)) if failed else (cached_binary(image_id), "")
