"""What one change of serve.gateway asks its apply to do: NGINX's own and the figures collector's. Literal types,
so mypy holds every Change's payload and apply's tests to them."""

from __future__ import annotations

from typing import Literal

CollectorAction = Literal["collector-script", "collector-create", "collector-start", "collector-remove"]
GatewayAction = Literal["key", "config", "create", "start", "reload"] | CollectorAction
