#!/usr/bin/env bash
# checkov in a venv of its own, outside any clone (it pulls in ~200 packages that must not
# mix with the project's), cached by version. Prints the path of its checkov executable.
# Used by .ci/run; by hand: export DDPDEPLOY_CHECKOV="$(bash .ci/checkov-setup.sh)".
set -euo pipefail
version="${CHECKOV_VERSION:-3.3.30}"
if [ -n "${DDPDEPLOY_TEST_CACHE:-}" ]; then
    cache="$DDPDEPLOY_TEST_CACHE"
elif [ -w /var/cache ]; then
    cache=/var/cache/ddpdeploy-test
else
    cache="${XDG_CACHE_HOME:-$HOME/.cache}/ddpdeploy-test"
fi
dest="$cache/checkov-$version"
mkdir -p "$cache"
# One installer at a time; a venv is not relocatable, so it is built in place and marked
# complete last: a half-built one (an interrupted run) is removed and built again.
exec 9>"$dest.lock"
flock 9
if [ ! -e "$dest/.complete" ]; then
    rm -rf "$dest"
    python3 -m venv "$dest"
    "$dest/bin/pip" install -q --disable-pip-version-check "checkov==$version" >&2
    "$dest/bin/checkov" --version >/dev/null
    touch "$dest/.complete"
fi
echo "$dest/bin/checkov"
