"""--json's view of a run: one JSON object per event, per line. Apart from the console's view, so that a run
printing JSON does not load rich (about 30 ms of every start)."""

from __future__ import annotations

import json
from typing import IO

from sparkctl.secrets import redacted
from sparkctl.taskgraph.events import Event


class JsonView:
    """One JSON object per line per event; the last line of a run is the recap."""

    def __init__(self, stream: IO[str]):
        self.stream = stream

    def __call__(self, event: Event) -> None:
        self.stream.write(json.dumps(redacted(event.to_dict()), ensure_ascii=False) + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass
