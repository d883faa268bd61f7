"""Where `ddpdeploy build` puts things: in the build context and in the image. Stated here once.

The launch contract runs the trainer at TRAINER_IN_IMAGE; the context builder files our
files under CONTEXT_BUILD and the user's under CONTEXT_WORKSPACE; docker/Dockerfile receives
every path as a build arg (`dockerfile_args`) and holds none of them itself.
"""

from __future__ import annotations

# In the build context the engine receives (docker/Dockerfile copies from these folders).
CONTEXT_BUILD = "ddpdeploy-build"  # reserved: our Dockerfile, requirements.txt, train/
CONTEXT_WORKSPACE = "workspace"  # the user's files, after .dockerignore
DOCKERFILE = f"{CONTEXT_BUILD}/Dockerfile"

# In the image.
TRAINER_DIR_IN_IMAGE = "/opt/ddpdeploy/train"
TRAINER_IN_IMAGE = f"{TRAINER_DIR_IN_IMAGE}/ddptrain.py"
# A user's script or module runs under torchrun through ddprun.py, beside the trainer on
# every target (the image, the wheel): it skips the interpreter teardown in which torch
# aborts finished runs now and then (train/ddprun.py says why).
RUNNER_NAME = "ddprun.py"
RUNNER_IN_IMAGE = f"{TRAINER_DIR_IN_IMAGE}/{RUNNER_NAME}"
# ddpkit.py (the helpers a user's script imports) sits beside the trainer: the Dockerfile
# puts the trainer's folder on the image's PYTHONPATH so `import ddpkit` works there.
WORKSPACE_IN_IMAGE = "/workspace"  # the user's code, and the working directory


def dockerfile_args() -> dict[str, str]:
    """The layout as docker/Dockerfile's build args (it declares them without defaults)."""
    return {
        "DDPDEPLOY_CONTEXT_BUILD": CONTEXT_BUILD,
        "DDPDEPLOY_CONTEXT_WORKSPACE": CONTEXT_WORKSPACE,
        "DDPDEPLOY_TRAINER_DIR": TRAINER_DIR_IN_IMAGE,
        "DDPDEPLOY_TRAINER": TRAINER_IN_IMAGE,
        "DDPDEPLOY_WORKSPACE": WORKSPACE_IN_IMAGE,
    }
