"""JobSpec: the one validated description of a training job that every command speaks.

Loaded from ``ddpdeploy.yaml`` (camelCase keys, like Kubernetes) and overridden by CLI flags
(options.py knows their spellings). Validation errors become one line naming the field (or
the flag) and what is allowed. fields.py holds the field grammars, model.py the model, and
load.py reading, merging and the error lines.
"""

from __future__ import annotations

import os

# Model classes build their validators at definition; pydantic then scans every installed
# distribution's entry points for plugins, a large share of `ddpdeploy render`'s start-up.
# ddpdeploy uses none, so the scan is skipped while the modules below define them, and the
# user's setting is restored afterwards (children such as torchrun inherit it unchanged).
_USER_PLUGINS = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
try:
    from ddpdeploy.paths import DEFAULT_FILE, SCHEMA_FILE
    from ddpdeploy.rules import RESERVED_ENV
    from ddpdeploy.spec.fields import (
        HOME_DIR,
        INSTANCE_LABEL,
        INT32_MAX,
        ISTIO_INJECT_ANNOTATION,
        KUEUE_QUEUE_LABEL,
        LOG_DIR,
        MANAGED_BY_LABEL,
        NAME_LABEL,
        OWN_DOMAIN,
        POD_GROUP_ANNOTATION,
        TMP_DIR,
        ImageRef,
        is_reserved_env,
        quantity,
    )
    from ddpdeploy.spec.load import Override, load_spec, spec_file, spec_with
    from ddpdeploy.spec.model import (
        IMAGE_UID,
        NCCL_FIELDS,
        Checkpoint,
        Diagnostics,
        JobSpec,
        canonical_json,
        json_schema,
        spec_sha256,
    )
finally:
    if _USER_PLUGINS is None:
        os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
    else:
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = _USER_PLUGINS

__all__ = [
    "DEFAULT_FILE",
    "HOME_DIR",
    "IMAGE_UID",
    "INSTANCE_LABEL",
    "INT32_MAX",
    "ISTIO_INJECT_ANNOTATION",
    "KUEUE_QUEUE_LABEL",
    "LOG_DIR",
    "MANAGED_BY_LABEL",
    "NAME_LABEL",
    "OWN_DOMAIN",
    "POD_GROUP_ANNOTATION",
    "NCCL_FIELDS",
    "RESERVED_ENV",
    "SCHEMA_FILE",
    "TMP_DIR",
    "Checkpoint",
    "Diagnostics",
    "ImageRef",
    "JobSpec",
    "Override",
    "canonical_json",
    "is_reserved_env",
    "json_schema",
    "load_spec",
    "quantity",
    "spec_file",
    "spec_sha256",
    "spec_with",
]
