"""Build (once per machine) the local images the docker tests use as --base-image.

No registry is reachable from CI, so nothing can be pulled: a Debian bookworm rootfs is made
with debootstrap and imported ("base"), then the CPU torch wheel and its runtime deps, which
pip finds on this machine, are installed into it ("torch"), standing in for the official
pytorch/pytorch runtime image.

Both images are tagged by a key hashed from this script and the wheels that went in, so a
change to either rebuilds them and an unchanged setup reuses them across runs and clones.
The debootstrap .debs and the wheels are cached outside the clone (see ``cache_dir``).

Run by hand: ``python tests/docker/base_images.py`` prints the torch image reference.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TORCH_VERSION = "2.13.0"
SUITE = "bookworm"
# pip resolves torch's runtime deps (filelock, sympy, networkx, jinja2, fsspec, …) to a
# consistent set; numpy as in the official image (torch warns without it); pip itself goes in
# too, so images built on top can install requirements. pip byte-compiles everything, which
# keeps `import torch` at ~2 s instead of ~10 s from source on every container start.
WHEELS = [f"torch=={TORCH_VERSION}", "numpy", "pip"]
REPO = "ddpdeploy-test"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def log(msg: str) -> None:
    print(f"[base-images] {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Outside any clone: $DDPDEPLOY_TEST_CACHE, else /var/cache/ddpdeploy-test when writable
    (root on CI), else $XDG_CACHE_HOME/ddpdeploy-test."""
    if env := os.environ.get("DDPDEPLOY_TEST_CACHE"):
        path = Path(env)
    elif os.access("/var/cache", os.W_OK):
        path = Path("/var/cache/ddpdeploy-test")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(xdg) / "ddpdeploy-test"
    path.mkdir(parents=True, exist_ok=True)
    return path


def apt_mirror() -> str:
    """The machine's own Debian mirror (deb822 or one-line sources), so debootstrap uses the
    same (possibly snapshot/proxied) archive apt does."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for stanza in re.split(r"\n\s*\n", text):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and SUITE in suites.group(1).split() and "security" not in uris[1]:
                return uris.group(1)
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                uri = next(p for p in parts[1:] if not p.startswith("["))
                return uri
    return DEFAULT_MIRROR


def fetch_wheels(dest: Path) -> list[Path]:
    """Wheels for Debian's python3 (3.11, like this host's) into the empty folder ``dest``,
    resolved afresh each run so no stale version lingers; from the local wheel store this
    takes seconds."""
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--quiet"]
    done = subprocess.run([*cmd, "-d", str(dest), *WHEELS], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"pip download {' '.join(WHEELS)} failed:\n{done.stderr[-2000:]}")
    return sorted(dest.glob("*.whl"))


def image_key(wheels: list[Path]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(SUITE.encode())
    for wheel in wheels:  # names carry the versions; the script pins what else matters
        digest.update(wheel.name.encode())
    return digest.hexdigest()[:12]


def has_image(client: Any, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_base(client: Any, ref: str, cache: Path) -> None:
    debs = cache / "debs"
    debs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ddpdeploy-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        mirror = apt_mirror()
        log(f"debootstrap {SUITE} (minbase + python3) from {mirror} ...")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3",
                f"--cache-dir={debs}",
                SUITE,
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Leave package lists, .debs and docs out of the image, as slim base images do.
        for sub in (
            "var/cache/apt/archives",
            "var/lib/apt/lists",
            "usr/share/doc",
            "usr/share/man",
            "usr/share/locale",
            "usr/share/info",
        ):
            for item in (rootfs / sub).glob("*"):
                if item.is_dir() and not item.is_symlink():
                    shutil.rmtree(item)
                elif item.name != "lock":
                    item.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], check=True
        )
        log(f"importing {ref} ({tarball.stat().st_size / 1e6:.0f} MB) ...")
        repo, tag = ref.rsplit(":", 1)
        client.api.import_image_from_file(
            str(tarball), repository=repo, tag=tag, changes=['CMD ["/bin/bash"]']
        )


def build_torch(client: Any, base: str, ref: str, wheels: list[Path]) -> None:
    """Install the wheels in a container with them bind-mounted read-only and commit it: the
    wheels (190 MB) never land in a layer, and no network is needed."""
    wheel_dir = wheels[0].parent
    pip = next(w for w in wheels if w.name.startswith("pip-"))
    script = (
        f"python3 /wheels/{pip.name}/pip install --no-index --no-cache-dir "
        "--break-system-packages --disable-pip-version-check /wheels/*.whl"
        # Behave like the official image: plain `pip install` works for users' requirements.
        " && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"
    )
    log(f"installing torch {TORCH_VERSION} + deps into {ref} ...")
    container = client.containers.create(
        base,
        ["/bin/sh", "-c", script],
        network_disabled=True,
        volumes={str(wheel_dir): {"bind": "/wheels", "mode": "ro"}},
    )
    try:
        container.start()
        result = container.wait()
        if result.get("StatusCode") != 0:
            tail = container.logs().decode(errors="replace")[-2000:]
            raise RuntimeError(f"installing wheels into {ref} failed:\n{tail}")
        repo, tag = ref.rsplit(":", 1)
        container.commit(
            repository=repo, tag=tag, changes=['CMD ["/bin/bash"]', "ENV PYTHONUNBUFFERED=1"]
        )
    finally:
        container.remove(force=True)


def remove_old_keys(client: Any, refs: dict[str, str]) -> None:
    """Older keys' images are dead weight on a long-lived CI machine: remove them and the
    untagged build cache built on them (tests untag their images but keep the layers as
    cache). Only these two repositories: other images under ddpdeploy-test/ may be in use."""
    current = {client.images.get(ref).id for ref in refs.values()}
    old: dict[str, list[str]] = {}
    for name in refs.values():
        for image in client.images.list(name=name.split(":")[0]):
            if image.id not in current:
                old[image.id] = image.tags
    if not old:
        return
    rows = client.api.images(all=True)
    parent = {row["Id"]: row.get("ParentId") or None for row in rows}
    untagged = {
        row["Id"] for row in rows if not row.get("RepoTags") or row["RepoTags"] == ["<none>:<none>"]
    }

    def depth_below_old(image_id: str) -> int | None:
        depth, cur = 0, image_id
        while cur and cur not in old:
            cur, depth = parent.get(cur), depth + 1
        return depth if cur else None

    stale = [(d, i) for i in untagged if (d := depth_below_old(i)) is not None and d > 0]
    for _, image_id in sorted(stale, reverse=True):  # children before their parents
        with contextlib.suppress(Exception):  # in use by a container: leave it
            client.api.remove_image(image_id, noprune=True)
    for tags in old.values():
        for tag in tags:
            with contextlib.suppress(Exception):
                client.api.remove_image(tag)


def ensure_images(client: Any | None = None) -> dict[str, str]:
    """Return {"base": ref, "torch": ref}, building whichever is missing."""
    if client is None:
        import docker

        client = docker.from_env()
    cache = cache_dir()
    start = time.monotonic()
    # One build at a time on a machine: CI runs tests/kube (test_up_build) in a second
    # pytest beside the suite; the second caller waits, then finds the images made.
    with open(cache / "images.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_images(client, cache, start)


def _ensure_images(client: Any, cache: Path, start: float) -> dict[str, str]:
    # A folder per run: concurrent sessions (two clones, one machine) never share one.
    with tempfile.TemporaryDirectory(dir=cache, prefix="wheels-") as tmp:
        wheels = fetch_wheels(Path(tmp))
        key = image_key(wheels)
        refs = {"base": f"{REPO}/base:{key}", "torch": f"{REPO}/torch:{key}"}
        if has_image(client, refs["torch"]):
            return refs
        if not has_image(client, refs["base"]):
            build_base(client, refs["base"], cache)
        build_torch(client, refs["base"], refs["torch"], wheels)
    remove_old_keys(client, refs)
    log(f"ready in {time.monotonic() - start:.0f}s: {refs['torch']}")
    return refs


if __name__ == "__main__":
    if "--clean" in sys.argv:
        shutil.rmtree(cache_dir(), ignore_errors=True)
    print(ensure_images()["torch"])
