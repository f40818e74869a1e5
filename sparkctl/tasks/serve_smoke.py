"""serve.smoke: the endpoint answers a chat completion with real text (read-only)."""

from __future__ import annotations

from sparkctl.engine.events import Event
from sparkctl.engine.task import Change, Scope, Task, TaskFailed
from sparkctl.serve_client import EndpointError, ServeClient, acceptance_from_metrics, is_degenerate
from sparkctl.tasks.model import serving_enabled
from sparkctl.tasks.serve_launch import endpoint

SMOKE_PROMPT = "In one short sentence: what does a cluster of two computers do?"
SMOKE_TOKENS = 32
DEGENERATE_HINT = ("Eagle3 output that degenerates into one repeated character is a known TensorRT-LLM bug on "
                   "SM12x (GB10), TensorRT-LLM #8615: use an image with the fix, or serve without the draft "
                   "(serve.decoding: none) to confirm")


class ServeSmokeTask(Task):
    name = "serve.smoke"
    phase = "serve"
    scope = Scope.CLUSTER
    needs = ("serve.launch",)
    description = "prove the endpoint answers a chat completion with text"
    checks = ("POST /v1/chat/completions from the controller returns text that is not one repeated character "
              "(the Eagle3 failure of TensorRT-LLM #8615); reports the acceptance length when the server gives it")
    changes = "nothing (read-only)"

    def check(self, ctx) -> list[Change]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        url = endpoint(inv)
        client = ServeClient(url, timeout=300, model=inv.serve_spec().model)
        status = client.health()
        if status != 200:
            if ctx.options.check:
                ctx.emit(Event(event="log", task=self.name, message=f"{url} is not serving yet: not tried"))
                return []
            raise TaskFailed(f"{url}/health answers {status or 'nothing'}",
                             hint="see `sparkctl serve logs` for the server's log")
        try:
            client.metrics()  # drain: the acceptance length below is this request's
            reply = client.chat(SMOKE_PROMPT, max_tokens=SMOKE_TOKENS)
        except EndpointError as exc:
            raise TaskFailed(f"a chat completion from {url} failed: {exc}") from exc
        if not reply.text.strip():
            raise TaskFailed(f"{url} answered a chat completion with no text",
                             hint="see `sparkctl serve logs` for the server's log")
        if is_degenerate(reply.text):
            raise TaskFailed(f"{url} answered with one repeated character: {reply.text[:40]!r}",
                             hint=DEGENERATE_HINT)
        acceptance = reply.acceptance_length
        if acceptance is None:
            try:
                acceptance = acceptance_from_metrics(client.metrics())
            except EndpointError:
                acceptance = None
        shown = f"; acceptance length {acceptance:.2f}" if acceptance is not None else ""
        ctx.emit(Event(event="log", task=self.name,
                       message=f"{url} answered in {reply.seconds:.1f}s: {reply.text[:80]!r}{shown}",
                       data={"smoke": {"endpoint": url, "seconds": round(reply.seconds, 3),
                                       "acceptance_length": acceptance}}))
        return []
