"""serve.smoke: the endpoint answers a chat completion with real text (read-only).

Asked from this machine when it reaches the endpoint (as a user does: the gateway, the key, the certificate), else
on the head (inside its container, over the SSH connection): either answer proves the server; the controller's route
to it is not needed, only reported (`serve chat` and `serve bench` need it; the head does not). Asked from here, a
rerun costs the head no `docker exec` for it.

From here, it is asked as the run begins (tasks/early.py): the completion comes while the other tasks check the
nodes, and counts only if no change was applied in the run since; else the task asks again at its turn.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from sparkctl.knowledge.serve_client import Completion, EndpointError, HttpFetch, ServeClient, is_degenerate
from sparkctl.knowledge.serve_metrics import acceptance_since, metrics_reading
from sparkctl.plan.serve import CERTIFICATE_HINT, endpoint, endpoint_fetch
from sparkctl.rules.serving import serving_enabled
from sparkctl.taskgraph.events import Event
from sparkctl.taskgraph.task import Change, Scope, Task, TaskFailed
from sparkctl.tasks.context import ClusterContext
from sparkctl.tasks.serve.api_key import api_key
from sparkctl.tasks.serve.server import gateway_client

SMOKE_PROMPT = "In one short sentence: what does a cluster of two computers do?"
SMOKE_TOKENS = 32
#: How long the controller waits for a connection to the endpoint before it says "not reachable from here": a
#: route that is not there costs a rerun no more than that.
REACH_TIMEOUT = 3.0
#: Once connected, how long /health may take to answer: a loaded head, or a gateway whose new workers are still
#: starting (a reload), answers late, and that says nothing of the route.
REACH_ANSWER_TIMEOUT = 30.0
DEGENERATE_HINT = ("Eagle3 output that degenerates into one repeated character is a known TensorRT-LLM bug on "
                   "SM12x (GB10), TensorRT-LLM #8615: use an image with the fix, or serve without the draft "
                   "(serve.decoding: none) to confirm")


@dataclass(frozen=True)
class Answer:
    """One model's smoke test: its name, what it serves, the reply, the acceptance length, where it was asked."""

    name: str
    model: str
    reply: Completion
    acceptance: float | None
    where: str


#: whether this machine reaches the endpoint (status, why not, a refused certificate), and each model's answer
#: asked from here where it does
Asked = tuple[tuple[int, str, bool], list[Answer | None] | None]


class ServeSmokeTask(Task[ClusterContext, None]):
    name = "serve.smoke"
    phase = "serve"
    scope = Scope.CLUSTER
    needs = ("serve.gateway",)
    description = "prove the endpoint answers a chat completion with text, for every model"
    checks = ("POST /v1/chat/completions through the gateway with the API key, for each model by its name, asked from "
              "this machine when it reaches the endpoint, else on the head (from inside its container, over SSH), "
              "returns text that is not one repeated character (the Eagle3 failure of TensorRT-LLM #8615); reports "
              "the acceptance length when the server gives it (/metrics read before and after: the collector's "
              "counters for TensorRT-LLM), and whether this machine reaches the endpoint")
    changes = "nothing (read-only)"
    read_only = True

    def ask_early(self, ctx: ClusterContext) -> None:
        if serving_enabled(ctx.inventory):
            # an endpoint this machine does not reach is asked nothing early: the head is asked at the task's turn
            ctx.early.start(self.name, lambda: asked if (asked := self._from_here(ctx))[1] is not None else None)

    def check(self, ctx: ClusterContext) -> list[Change[None]]:
        inv = ctx.inventory
        if not serving_enabled(inv):
            return []
        head = ctx.head()
        url = endpoint(inv)
        models = inv.served_models()
        asked: Asked | None = ctx.early.take(self.name)
        if asked is not None and ctx.options.verbosity >= 1:
            ctx.emit(Event(event="log", message=f"{self.name}: asked from here as the run began"))
        (reach, reach_why, refused), here = asked if asked is not None else self._from_here(ctx)
        # a model not answered from here (no route, or its request failed on the way) is asked on the head: this
        # machine's route to the endpoint must not count against the server
        answers = [answer or Answer(model.name, model.spec.model,
                                    *self._ask(ctx, gateway_client(head, timeout=300, model=model.name)))
                   for answer, model in zip(here or [None] * len(models), models, strict=True)]
        for answer in answers:
            reply, acceptance, where = answer.reply, answer.acceptance, answer.where
            shown = f"; acceptance length {acceptance:.2f}" if acceptance is not None else ""
            named = f" as {answer.name}" if len(answers) > 1 else ""
            ctx.emit(Event(event="log", task=self.name,
                           message=f"{where} answered{named} in {reply.seconds:.1f}s: {reply.text[:80]!r}{shown}",
                           data={"smoke": {"endpoint": url, "seconds": round(reply.seconds, 3),
                                           "answer": reply.text.strip()[:80], "acceptance_length": acceptance,
                                           "reachable_from_here": reach == 200, "model": answer.model,
                                           "name": answer.name}}))
        if refused:
            ctx.emit(Event(event="log", task=self.name,
                           message=f"{reach_why}: the server is fine on {head.name}, but this machine refuses its "
                                   f"certificate ({CERTIFICATE_HINT})"))
        elif reach != 200:
            port = models[0].spec.port
            ctx.emit(Event(event="log", task=self.name,
                           message=f"{url} does not answer from this machine ({reach or reach_why}); the server "
                                   f"is fine on {head.name}. `sparkctl serve chat|bench` from here need a route, "
                                   f"e.g. `ssh -N -L {port}:127.0.0.1:{port} {inv.head.host}`"))
        return []

    def _from_here(self, ctx: ClusterContext) -> Asked:
        """Whether this machine reaches the endpoint, and then every model's answer asked from here (None for a
        model whose request failed on the way: the check asks that one on the head); no answers where it does not
        reach it. Raises where the server's answer fails the test."""
        inv = ctx.inventory
        from_here = endpoint_fetch(inv, api_key(inv))
        reach = self._reach(from_here)
        if reach[0] != 200:
            return reach, None
        answers: list[Answer | None] = []
        for model in inv.served_models():
            try:
                answers.append(Answer(model.name, model.spec.model,
                                      *self._completion(ctx, ServeClient(from_here, timeout=300, model=model.name))))
            except EndpointError:
                answers.append(None)
        return reach, answers

    @staticmethod
    def _reach(fetch: HttpFetch) -> tuple[int, str, bool]:
        """Whether this machine reaches the endpoint (ServeClient.reach): the route proven by a TCP connection
        within REACH_TIMEOUT, then /health given REACH_ANSWER_TIMEOUT to answer."""
        try:
            socket.create_connection((fetch.host, fetch.port), timeout=REACH_TIMEOUT).close()
        except OSError as exc:
            return 0, f"{fetch.where}: {exc}", False
        return ServeClient(fetch).reach(timeout=REACH_ANSWER_TIMEOUT)

    @staticmethod
    def _ask(ctx: ClusterContext, client: ServeClient) -> tuple[Completion, float | None, str]:
        """One chat completion of the client's model through the gateway: its reply, the acceptance length when the
        server gives it (the model's own figures: the gateway's /metrics?model=NAME), and where it was asked; a
        request that fails is a TaskFailed saying whether the server is down."""
        where = client.base_url
        try:
            return ServeSmokeTask._completion(ctx, client)
        except EndpointError as exc:
            # /health only once something failed (serve.launch has just seen it answer 200): it says
            # whether the server is down or this request failed
            status, why = client.health_detail()
            if status != 200:
                raise TaskFailed(f"{where}/health answers {status or 'nothing'}" + (f": {why}" if why else ""),
                                 hint="see `sparkctl serve logs` for the server's log") from exc
            raise TaskFailed(f"a chat completion of {client.model} from {where} failed: {exc}") from exc

    @staticmethod
    def _completion(ctx: ClusterContext, client: ServeClient) -> tuple[Completion, float | None, str]:
        """_ask's one request and its judgement; EndpointError where the request itself failed."""
        where = client.base_url
        # /metrics read before and after, in the same exec: the acceptance length is this request's
        reply, before, after = client.chat_between_metrics(SMOKE_PROMPT, max_tokens=SMOKE_TOKENS)
        if not reply.text.strip():
            raise TaskFailed(f"{where} answered a chat completion of {client.model} with no text",
                             hint="see `sparkctl serve logs` for the server's log")
        if is_degenerate(reply.text):
            raise TaskFailed(f"{where} answered with one repeated character: {reply.text[:40]!r}",
                             hint=DEGENERATE_HINT)
        acceptance = reply.acceptance_length
        if acceptance is None and before is not None and after is not None:
            names = ctx.inventory.engine().metrics
            acceptance = acceptance_since(metrics_reading(before, names), metrics_reading(after, names))
        return reply, acceptance, where
