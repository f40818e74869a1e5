"""The task graph: phases in order, tasks topologically sorted inside a phase, and --only/--skip selection."""

from __future__ import annotations

import difflib
import heapq
from collections.abc import Iterable

from sparkctl.taskgraph.task import Task


class GraphError(ValueError):
    """The graph itself is wrong (a programming error in a playbook, not a user error)."""


class UnknownSelection(ValueError):
    """--only/--skip/--limit named something that does not exist; the message says what was meant."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Graph:
    """Tasks grouped by phase. `ordered()` is phase by phase, topological within a phase, stable.

    A graph may carry a selection (`select`): tasks outside it stay in `ordered()` so the runner can
    report them as skipped. A selected task whose need was left out (`--skip`) does not run: it is skipped
    with that need named (a task never runs on a state its needs did not make).

    `verify_phase` names the phase whose tasks prove the whole result (bootstrap's `verify`): a run says
    "verified" only when they ran and passed.
    """

    def __init__(self, tasks: list[Task], phases: list[str], *, selected: Iterable[str] | None = None,
                 verify_phase: str | None = None, added: Iterable[str] = (), left_out: Iterable[str] = ()):
        self.phases = list(phases)
        self.tasks = list(tasks)
        self.verify_phase = verify_phase
        self._by_name: dict[str, Task] = {}
        self._validate()
        self._ordered = self._order()
        self.selected: frozenset[str] = (
            frozenset(self._by_name) if selected is None else frozenset(selected)
        )
        #: needs `select` added to what --only named
        self.added: tuple[str, ...] = tuple(added)
        #: tasks --skip left out although a selected task needs them
        self.left_out: frozenset[str] = frozenset(left_out)

    def _validate(self) -> None:
        if len(set(self.phases)) != len(self.phases):
            raise GraphError(f"duplicate phase names in {self.phases}")
        phase_index = {p: i for i, p in enumerate(self.phases)}
        for task in self.tasks:
            if task.name in self._by_name:
                raise GraphError(f"duplicate task name '{task.name}'")
            if task.phase not in phase_index:
                raise GraphError(f"task '{task.name}' is in unknown phase '{task.phase}'"
                                 f"{did_you_mean(task.phase, self.phases)}")
            self._by_name[task.name] = task
        for task in self.tasks:
            for need in task.needs:
                if need not in self._by_name:
                    raise GraphError(f"task '{task.name}' needs unknown task '{need}'"
                                     f"{did_you_mean(need, self._by_name)}")
                if phase_index[self._by_name[need].phase] > phase_index[task.phase]:
                    raise GraphError(f"task '{task.name}' (phase {task.phase}) needs '{need}' "
                                     f"from the later phase {self._by_name[need].phase}")

    def _order(self) -> list[Task]:
        position = {t.name: i for i, t in enumerate(self.tasks)}
        ordered: list[Task] = []
        for phase in self.phases:
            members = [t for t in self.tasks if t.phase == phase]
            names = {t.name for t in members}
            waiting = {t.name: sum(1 for n in set(t.needs) if n in names) for t in members}
            dependents: dict[str, list[str]] = {t.name: [] for t in members}
            for t in members:
                for n in set(t.needs):
                    if n in names:
                        dependents[n].append(t.name)
            # Kahn's algorithm, always taking the earliest declared ready task: stable and deterministic.
            ready = [position[n] for n, count in waiting.items() if count == 0]
            heapq.heapify(ready)
            done = 0
            while ready:
                task = self.tasks[heapq.heappop(ready)]
                ordered.append(task)
                done += 1
                for dependent in dependents[task.name]:
                    waiting[dependent] -= 1
                    if waiting[dependent] == 0:
                        heapq.heappush(ready, position[dependent])
            if done != len(members):
                stuck = sorted((n for n, c in waiting.items() if c > 0), key=position.__getitem__)
                raise GraphError(f"dependency cycle in phase {phase} among: {', '.join(stuck)}")
        return ordered

    def ordered(self) -> list[Task]:
        return list(self._ordered)

    def task(self, name: str) -> Task:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self.tasks)

    def is_selected(self, name: str) -> bool:
        return name in self.selected

    def needs_closure(self, name: str) -> list[str]:
        """Every task `name` needs, directly or not, nearest first, each once."""
        seen: list[str] = []
        frontier = list(self._by_name[name].needs)
        while frontier:
            need = frontier.pop(0)
            if need in seen:
                continue
            seen.append(need)
            frontier.extend(self._by_name[need].needs)
        return seen

    def _resolve(self, entries: Iterable[str]) -> set[str]:
        names: set[str] = set()
        for entry in entries:
            if entry in self._by_name:
                names.add(entry)
            elif entry in self.phases:
                names.update(t.name for t in self.tasks if t.phase == entry)
            else:
                known = [*self.phases, *self._by_name]
                raise UnknownSelection(f"unknown task or phase '{entry}'{did_you_mean(entry, known)}; "
                                       f"phases: {', '.join(self.phases)}")
        return names

    def select(self, only: set[str] | None = None, skip: set[str] | None = None) -> Graph:
        """A copy of this graph that runs `only` (phases or tasks; all when None) AND everything they need,
        minus `skip`. What --only pulled in is `added`; a need that --skip removed is in `left_out` (its
        dependents are skipped, naming it)."""
        requested = self._resolve(only) if only else set(self._by_name)
        chosen = set(requested)
        for name in requested:
            chosen.update(self.needs_closure(name))
        skipped = self._resolve(skip or ())
        chosen -= skipped
        position = {t.name: i for i, t in enumerate(self._ordered)}
        added = sorted(chosen - requested, key=position.__getitem__)
        left_out = {need for name in chosen for need in self.needs_closure(name) if need in skipped}
        return Graph(self.tasks, self.phases, selected=chosen, verify_phase=self.verify_phase, added=added,
                     left_out=left_out)
