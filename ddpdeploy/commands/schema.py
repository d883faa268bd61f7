"""`ddpdeploy schema`: the JSON Schema of ddpdeploy.yaml, for editors and CI checks."""

from __future__ import annotations

import json


def schema() -> None:
    """Print the JSON Schema of ddpdeploy.yaml (camelCase fields, descriptions, allowed values).

    Example: ddpdeploy schema > .ddpdeploy.schema.json   (what `ddpdeploy init` writes)
    """
    from ddpdeploy.adapters.stdout import write_stdout
    from ddpdeploy.spec import json_schema

    write_stdout(json.dumps(json_schema(), indent=2) + "\n")
