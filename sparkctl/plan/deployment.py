"""A deployment: what a serving cluster runs, as one thing that can be switched and put back.

It is the engine's image as the nodes hold it (reference, image ID, registry digest), the launch (the engine's
config and command lines, by fingerprint), the model's revision on the head, and the inventory's words that made
them (`container.image` and the `serve:` section as written). The head keeps the one in use and the one before
it in <state>/run/serve/deployments.json, written once a deployment has answered its smoke test; a switch under
way is marked there too. Bootstrap puts the previous one back when a switch fails; `sparkctl serve rollback`
does it by hand (docs/serving.md).
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import ValidationError

from sparkctl.errors import BadInput
from sparkctl.facts.parse import docker_image_id
from sparkctl.inventory import Inventory

DEPLOYMENTS_FILE = "deployments.json"
#: the controller's copy of the head's record, among its records (runs/proofs.py), for `cluster plan` (offline)
COPY_KEY = "deployments"


def deployments_path(serve_dir: str) -> str:
    return posixpath.join(serve_dir, DEPLOYMENTS_FILE)


def deployment_inputs(inventory: Inventory) -> dict[str, Any]:
    """The inventory's words that make a deployment: the image the containers run and `serve:` as written."""
    return {"container_image": inventory.container.image,
            "serve": inventory.serve.model_dump(mode="json", exclude_unset=True)}


def _short(value: str | None) -> str:
    return value.split(":", 1)[-1][:12] if value else "-"


@dataclass(frozen=True)
class Deployment:
    image: str                  # the reference the containers run
    image_id: str | None        # the same on every node (serve.switch refuses a cluster where it is not)
    digest: str | None          # the registry's, where the image was pulled from one
    engine: str
    model: str
    fingerprint: str            # the launch's: the engine's config and every node's command line
    inputs: dict[str, Any]
    revision: str | None = None  # the model's snapshot on the head, once it is known
    number: int = 0             # 0: not recorded yet
    at: float = 0.0             # when it first answered

    def same_world(self, other: Deployment | None) -> bool:
        """Would switching between the two restart the world? (the image the ranks run, their launch, or the
        model's commit where both know it)"""
        return (other is not None and (self.image_id, self.fingerprint) == (other.image_id, other.fingerprint)
                and (self.revision is None or other.revision is None or self.revision == other.revision))

    def same(self, other: Deployment | None) -> bool:
        """The same in every recorded word (the revision and the inventory's words included)."""
        return (other is not None and self.same_world(other) and self.revision == other.revision
                and self.inputs == other.inputs and self.image == other.image and self.digest == other.digest)

    def summary(self) -> str:
        number = f"#{self.number} " if self.number else ""
        digest = f", digest {_short(self.digest)}" if self.digest else ""
        revision = f"@{self.revision[:12]}" if self.revision else ""
        return f"{number}{self.image} (image {_short(self.image_id)}{digest}; {self.engine} {self.model}{revision})"

    def data(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, value: Any) -> Deployment | None:
        if not isinstance(value, dict):
            return None
        try:
            found = cls(**{k: value[k] for k in cls.__dataclass_fields__ if k in value})
        except TypeError:
            return None
        # a record kept from podman's CLI holds the bare hex of the id docker writes as sha256:<hex>
        return replace(found, image_id=docker_image_id(found.image_id))


@dataclass(frozen=True)
class DeploymentRecord:
    """What the head keeps: the deployment in use, the one before it, and a switch begun and not yet answered."""

    current: Deployment | None = None
    previous: Deployment | None = None
    switching: Deployment | None = None

    @classmethod
    def parse(cls, text: str) -> DeploymentRecord:
        """The file's text; anything unreadable is no record (a switch then has nothing to go back to)."""
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        return cls(*(Deployment.of(data.get(k)) for k in ("current", "previous", "switching")))

    def text(self) -> str:
        return json.dumps({k: v.data() if v is not None else None for k, v in
                           (("current", self.current), ("previous", self.previous), ("switching", self.switching))},
                          indent=1, sort_keys=True) + "\n"

    def begun(self, planned: Deployment) -> DeploymentRecord:
        return replace(self, switching=planned)

    def answered(self, planned: Deployment, now: float) -> DeploymentRecord:
        """The record once `planned` answered: it is in use; the one it replaced is kept as the previous (a
        return to the previous one swaps the two); at most two are kept."""
        if planned.same_world(self.current):
            assert self.current is not None
            return DeploymentRecord(replace(planned, number=self.current.number, at=self.current.at), self.previous)
        if planned.same_world(self.previous):
            assert self.previous is not None
            return DeploymentRecord(replace(planned, number=self.previous.number, at=self.previous.at), self.current)
        numbers = [d.number for d in (self.current, self.previous) if d is not None]
        return DeploymentRecord(replace(planned, number=max(numbers, default=0) + 1, at=now), self.current)


def with_deployment(inventory: Inventory, deployment: Deployment) -> Inventory:
    """The inventory with the deployment's words in place of its own (`container.image`, `serve:`): what bootstrap
    runs to put that deployment back. Refused (BadInput) when the rest of the inventory no longer fits it."""
    data = inventory.model_dump(mode="json", exclude_unset=True)
    data.setdefault("container", {})["image"] = deployment.inputs.get("container_image", deployment.image)
    data["serve"] = deployment.inputs.get("serve", {})
    try:
        back = Inventory.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise BadInput(f"deployment {deployment.summary()} does not fit the inventory as it is now"
                       f" ({where}: {first.get('msg')})",
                       hint="put its image and serve: section back in the inventory by hand") from None
    back._source, back._lines = inventory._source, inventory._lines
    return back
