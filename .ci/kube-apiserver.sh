#!/usr/bin/env bash
# Builds (or reuses) a kube-apiserver for the cluster tests and prints its path on stdout.
# No package ships the binary, but Debian 12's `kubernetes` source package vendors all it
# needs. The binary is cached outside the clone, keyed by the source package version, so a
# later run on the same machine skips the ~10 minute build. Needs root (apt).
set -euo pipefail

CACHE=${DDPDEPLOY_KUBE_CACHE:-/var/cache/ddpdeploy-test}
mkdir -p "$CACHE"
log() { echo "kube-apiserver.sh: $*" >&2; }

# One build at a time on this machine; a second caller waits and then reuses the result.
exec 9>"$CACHE/kube-apiserver.lock"
flock 9

if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    log "adding a deb-src source for bookworm main"
    cat >/etc/apt/sources.list.d/ddpdeploy-deb-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq >&2
fi

version=$(apt-cache showsrc kubernetes 2>/dev/null | awk '/^Version:/ {print $2; exit}')
if [ -z "$version" ]; then
    apt-get update -qq >&2
    version=$(apt-cache showsrc kubernetes | awk '/^Version:/ {print $2; exit}')
fi
out="$CACHE/kube-apiserver-$version/kube-apiserver"

# etcd comes from the binary package; the fixture starts it next to the apiserver.
pkgs=(etcd-server)
[ -x "$out" ] || pkgs+=(golang-go rsync make golang-github-modern-go-reflect2-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

if [ -x "$out" ]; then
    log "reusing $out"
    echo "$out"
    exit 0
fi

start=$(date +%s)
work="$CACHE/build-$version"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
log "fetching the kubernetes $version source package"
apt-get source --download-only "kubernetes=$version" >&2
orig=$(ls kubernetes_*.orig.tar.* | head -n1)
mkdir src
tar -xf "$orig" -C src --strip-components=1

# The vendored reflect2 1.0.1 crashes the apiserver under Go >= 1.18; Debian's copy works.
rm -rf src/vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 src/vendor/github.com/modern-go/reflect2

log "building (nice 10); this takes 10+ minutes on 2 cores"
(cd src && GOPROXY=off GOCACHE="$work/gocache" nice -n 10 \
    make WHAT=cmd/kube-apiserver KUBE_BUILD_PLATFORMS=linux/amd64 GOFLAGS=-tags=providerless >&2)

built=$(find src/_output -type f -name kube-apiserver -perm -u+x | head -n1)
[ -n "$built" ] || { log "build produced no kube-apiserver"; exit 1; }
mkdir -p "$(dirname "$out")"
cp "$built" "$out.tmp"
mv "$out.tmp" "$out"
cd /
rm -rf "$work"
log "built in $(( $(date +%s) - start ))s"
echo "$out"
