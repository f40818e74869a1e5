"""model.verify: a node's own download of the model and its draft checked against the hashes the Hub recorded
(plan/hub_hashes.py, docs/models.md). With serve.distribute: copy, model.copy does it (the head before it sends,
each peer on arrival).

Idempotent: what a node verified is kept by stat in <hf_cache>/sparkctl-verified/, so a rerun reads nothing again
(one read of the node, read ahead with its facts); a file changed since is read again, a wrong one removed for the
next download.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.plan import hub_hashes
from sparkctl.plan.serve import node_repos
from sparkctl.rules.serving import copy_mode, serves
from sparkctl.taskgraph.task import Change, Task
from sparkctl.tasks.context import NodeContext
from sparkctl.tasks.model.cache import repo_path
from sparkctl.tasks.model.progress import human_bytes
from sparkctl.tasks.model.verified import hash_files, keep_verified, remove_files, wrong_download
from sparkctl.transport.framing import Framing


@dataclass(frozen=True)
class VerifyStep:
    repo: str
    repo_dir: str
    paths: tuple[str, ...]
    recorded: frozenset[str]
    record_path: str
    #: a --local-dir's files -> their etag (its download metadata's); a hub blob names its own
    etags: tuple[tuple[str, str], ...] = ()


def snapshot_blobs_script(repo_dir: str) -> str:
    """`P blobs/<etag>` for each blob the current snapshot's links lead to, then the blobs' stats and the record."""
    return hub_hashes.each_snapshot_blob(repo_dir, "printf 'P\\tblobs/%s\\n' \"$b\"") + "; true"


class ModelVerifyTask(Task[NodeContext, VerifyStep]):
    name = "model.verify"
    phase = "model"
    needs = ("model.fetch",)
    description = "check the node's own download of the model and its draft against the hashes the Hub recorded"
    checks = ("every blob of the model's current snapshot, and every file of the draft's --local-dir that "
              "huggingface_hub kept download metadata for, verified against its etag (sha256, or git blob sha1) "
              "since its size, mtime and inode last changed (<hf_cache>/sparkctl-verified/; --reprove: all); one "
              "read of the node, read ahead with its facts; with serve.distribute: copy, model.copy's")
    changes = ("hashes what is not verified, each file read once, and records it; a wrong file is removed and the "
               "run fails (the next one downloads it again)")

    def check(self, ctx: NodeContext) -> list[Change[VerifyStep]]:
        inv = ctx.inventory
        if not serves(inv, ctx.name) or copy_mode(inv):
            return []
        repos = [(repo, repo_path(ctx, repo, local), local is None) for repo, local in node_repos(inv, ctx.name)]
        framing = Framing()
        records = {repo: hub_hashes.record_path(ctx.hf_cache_dir(), path) for repo, path, _hub in repos}
        script = "\n".join([*(framing.section(f"repo{i}", (snapshot_blobs_script(path) if hub else
                                                           hub_hashes.local_etags_script(path)) + "\n"
                                              + hub_hashes.stat_script(path, records[repo], hub))
                              for i, (repo, path, hub) in enumerate(repos)), "true"])
        texts = Framing.texts_of(framing.split(ctx.read(self.name, script, framing).stdout))
        changes = []
        for i, (repo, path, hub) in enumerate(repos):
            text = texts.get(f"repo{i}", "")
            etags = {} if hub else hub_hashes.parse_etags(text)
            files = [line.partition("\t")[2] for line in text.splitlines() if line.startswith("P\t")] if hub \
                else sorted(etags)
            record, stats = hub_hashes.parse_stats(text)
            todo = hub_hashes.unverified(files, record, stats, ctx.options.reprove, etags)
            if not todo:
                continue
            size = sum(int(stats[p][0]) for p in todo if p in stats and stats[p][0].isdigit())
            changes.append(Change(f"verify {len(todo)} files of {repo} against the hashes the Hub recorded "
                                  f"({human_bytes(size)})",
                                  payload=VerifyStep(repo, path, tuple(todo), frozenset(record), records[repo],
                                                     tuple((p, etags[p]) for p in todo if p in etags))))
        return changes

    def apply(self, ctx: NodeContext, changes: list[Change[VerifyStep]]) -> None:
        try:
            for change in changes:
                step = change.carried()
                good, wrong = hash_files(ctx, step.repo_dir, step.paths, dict(step.etags))
                if good:
                    keep_verified(ctx, step.record_path, step.recorded, good)
                if wrong:
                    remove_files(ctx, step.repo_dir, wrong, step.repo)
                    raise wrong_download(step.repo, ctx.name, wrong)
        finally:
            ctx.invalidate()
