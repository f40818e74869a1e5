"""sparkctl's watchdog of a serving world, run by the head's world.sh beside the server (docs/serving.md, "A wedged
world").

The failure the field reports most is not a dead process: /health and /v1/models keep answering 200 while no token
comes out (an all-reduce that never returns, a scheduler that stopped). The tell is the engine's own counter of
generated tokens frozen while requests are running. So, every few seconds, this reads the figures every reader
shares (the engine's Prometheus text, or its world's collector's for TensorRT-LLM) where the world's engine answers
(the head's loopback, or the world head's fabric address), and judges the world stuck when
- requests are running and the generated-token counter has not moved for --stall-s, or
- no request is running and a one-token completion sent to the engine's own port (the canary, every --canary-s,
  never while the engine is busy) gets no token within --canary-deadline-s.
Stuck, it writes what it saw (the reason, when the last token came, requests running, this node's GPU power) to
--evidence and ends the world (TERM, then KILL): the unit records the end as `stuck` and starts the whole world
again. It judges nothing while the engine's own /health does not answer 200 (a model takes minutes to load; a
collector's /metrics answers before the engine does), and its clocks start when it does.

Runs inside the engine's container with the image's python3 and prometheus_client (a requirement of every engine
sparkctl serves). Nothing of sparkctl is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

POLL_S = 2.0


def figures(url: str, running: str, tokens: str) -> tuple[float, float] | None:
    """(requests running, generated tokens) summed over the engine's label sets; None when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode(errors="replace")
    except (OSError, ValueError):
        return None
    sums = {running: 0.0, tokens: 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name in sums:
                if family.name == name and sample.name in (name, f"{name}_total"):
                    sums[name] += sample.value
    return sums[running], sums[tokens]


def canary(url: str, model: str, deadline: float) -> str | None:
    """None when a one-token completion came back in time, else why not."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1,
                       "stream": False}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=deadline) as answer:
            reply = json.loads(answer.read() or b"{}")
    except (OSError, ValueError) as exc:
        return f"a one-token canary completion got no answer within {deadline:g}s ({exc})"
    if not (reply.get("choices") or []):
        return "a one-token canary completion came back without a choice"
    return None


def healthy(url: str) -> bool:
    """The engine's own /health answers 200: it serves (not loading, not gone)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
            return answer.status == 200
    except (OSError, ValueError):
        return False


def gpu_power() -> list[float]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.draw", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    values = []
    for line in out.splitlines():
        try:
            values.append(round(float(line.strip()), 1))
        except ValueError:
            continue
    return values


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def end_world(pid: int, stop_wait: float) -> None:
    """TERM the world (its process group when it leads one), KILL what is left after stop_wait."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig) if os.getpgid(pid) == pid else os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + stop_wait
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch(args: argparse.Namespace) -> dict | None:
    """Until the world is stuck: what was seen then; None when the world ended by itself first."""
    answered = False
    last_tokens, last_progress, last_canary = None, time.time(), time.time()
    while True:
        time.sleep(args.poll_s)
        if not alive(args.pid):
            return None
        now = time.time()
        if not healthy(args.engine):
            # loading, or gone: not a wedge (the unit sees a dead server itself); the clocks start once it serves
            last_progress = last_canary = now
            continue
        seen = figures(args.metrics, args.running, args.tokens)
        if seen is None:
            continue
        running, tokens = seen
        if not answered or tokens != last_tokens:
            answered, last_tokens, last_progress = True, tokens, now
        if running > 0:
            if now - last_progress >= args.stall_s:
                return {"reason": f"no token for {now - last_progress:.0f}s with {running:g} requests running",
                        "last_token_at": iso(last_progress), "running": running, "generated_tokens": tokens}
            continue
        last_progress = max(last_progress, now - args.poll_s)  # idle is not a stall
        if now - last_canary >= args.canary_s:
            last_canary = now
            why = canary(args.engine, args.model, args.canary_deadline_s)
            if why is not None:
                # a world that is ending (a rank died, the connection closed under the canary) is not stuck: the
                # unit sees it end; a wedge is a world still alive and healthy that gives no token
                time.sleep(args.poll_s)
                if not alive(args.pid):
                    return None
                if not healthy(args.engine):
                    last_progress = last_canary = time.time()
                    continue
                return {"reason": why, "last_token_at": iso(last_progress), "running": running,
                        "generated_tokens": tokens}
            last_canary = time.time()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--pid", type=int, required=True, help="the world's process (mpirun, or this rank)")
    parser.add_argument("--metrics", required=True, help="/metrics every reader shares, on the head's loopback")
    parser.add_argument("--running", required=True, help="the gauge of requests running")
    parser.add_argument("--tokens", required=True, help="the counter of generated tokens")
    parser.add_argument("--engine", required=True, help="the engine's own base URL, for the canary")
    parser.add_argument("--model", required=True)
    parser.add_argument("--stall-s", type=float, required=True)
    parser.add_argument("--canary-s", type=float, required=True)
    parser.add_argument("--canary-deadline-s", type=float, required=True)
    parser.add_argument("--stop-wait", type=float, default=15.0)
    parser.add_argument("--poll-s", type=float, default=POLL_S, help="seconds between two reads of the figures")
    parser.add_argument("--evidence", required=True, help="where what was seen is written when the world is stuck")
    parser.add_argument("--stopping", help="the mark of a world asked to stop: it is not judged")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    seen = watch(args)
    if seen is None or (args.stopping and os.path.exists(args.stopping)):
        return  # a world asked to stop answers nothing while it stops: that is not stuck
    seen.update(stuck_at=iso(time.time()), gpu_power_w=gpu_power())
    with open(args.evidence + ".new", "w") as handle:
        json.dump(seen, handle, separators=(",", ":"), sort_keys=True)
    os.replace(args.evidence + ".new", args.evidence)
    print(f"=== sparkctl: the world is stuck: {seen['reason']}; ending it to start it again", flush=True)
    end_world(args.pid, args.stop_wait)


if __name__ == "__main__":
    main()
