"""`Obj`: an object of the outside world as plain data (a Kubernetes object, a compose
project, a JSON document), as the renderers make it and the adapters send and read it."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
