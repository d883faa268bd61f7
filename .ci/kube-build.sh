#!/usr/bin/env bash
# Builds (or reuses) the Kubernetes 1.20 binaries the cluster tests run and prints the folder
# that holds them: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl
# and a static pause binary. No package ships them (Debian's kubectl crashes, see below), but
# Debian 12's `kubernetes` source package vendors all they need, so the build is offline.
#
# Cached outside the clone in $DDPDEPLOY_KUBE_CACHE (default /var/cache/ddpdeploy-test):
#   kube-<version>-<patches>/   the binaries, keyed by the source version and a hash of this
#                               script's patch list (a new patch builds a new folder)
#   kube-src-<version>/         the unpacked tree with its Go cache, so a patch change
#                               rebuilds only what it touches (a cold build: 15-30 min on 2
#                               cores; after a kubelet patch: under a minute)
# One build at a time on a machine; a second caller waits and reuses the result. Needs root.
set -euo pipefail

CACHE=${DDPDEPLOY_KUBE_CACHE:-/var/cache/ddpdeploy-test}
mkdir -p "$CACHE"
log() { echo "kube-build.sh: $*" >&2; }

exec 9>"$CACHE/kube-build.lock"
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

# The source patches, one per line: FILE<TAB>FROM<TAB>TO (fixed strings, each must match).
# 1. The vendored reflect2 1.0.1 crashes every binary under Go >= 1.18 (Debian's own kubectl
#    binary panics in `config set-credentials` for this reason): Debian's reflect2 replaces it
#    (done below, not a line here).
# 2. This VM withholds CAP_SYS_RESOURCE, so nothing may lower oom_score_adj below 0: runc then
#    fails every pod sandbox (-998) and Guaranteed container (-997) with "can't get final
#    child's PID from pipe: EOF". 0 keeps the OOM order (Burstable 2-999, BestEffort 1000).
# 3. The kubelet rewrites host kernel settings at start (kernel.panic_on_oops=1 among them);
#    on a shared machine it must only warn.
patches=$(cat <<'P'
pkg/kubelet/dockershim/docker_sandbox.go	defaultSandboxOOMAdj int = -998	defaultSandboxOOMAdj int = 0
pkg/kubelet/qos/policy.go	guaranteedOOMScoreAdj int = -997	guaranteedOOMScoreAdj int = 0
pkg/kubelet/cm/container_manager_linux.go	b := KernelTunableModify	b := KernelTunableWarn
P
)
key=$(printf '%s\nreflect2=debian\npause=static\n' "$patches" | sha256sum | cut -c1-12)
out="$CACHE/kube-$version-$key"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause)

complete() { for b in "${bins[@]}"; do [ -x "$out/$b" ] || return 1; done; }

# etcd and CNI come from Debian's binary packages; the rest only for a build.
pkgs=(etcd-server containernetworking-plugins)
complete || pkgs+=(golang-go rsync make gcc golang-github-modern-go-reflect2-dev)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2
fi

if complete; then
    log "reusing $out"
    echo "$out"
    exit 0
fi

start=$(date +%s)
src="$CACHE/kube-src-$version"
if [ ! -e "$src/.unpacked" ]; then
    rm -rf "$src"
    mkdir -p "$src/dl" "$src/tree"
    log "fetching the kubernetes $version source package"
    (cd "$src/dl" && apt-get source --download-only "kubernetes=$version" >&2)
    tar -xf "$(ls "$src"/dl/kubernetes_*.orig.tar.* | head -n1)" -C "$src/tree" --strip-components=1
    rm -rf "$src/tree/vendor/github.com/modern-go/reflect2"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 \
        "$src/tree/vendor/github.com/modern-go/reflect2"
    # The pristine files the patches touch, so a changed patch list starts from them.
    while IFS=$'\t' read -r file _ _; do
        cp "$src/tree/$file" "$src/tree/$file.orig"
    done <<<"$patches"
    touch "$src/.unpacked"
fi
tree="$src/tree"
while IFS=$'\t' read -r file from to; do
    cp "$tree/$file.orig" "$tree/$file"
    grep -qF "$from" "$tree/$file" || { log "patch no longer applies: $file: $from"; exit 1; }
    python3 - "$tree/$file" "$from" "$to" <<'PY'
import pathlib, sys
p, a, b = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
p.write_text(p.read_text().replace(a, b))
PY
done <<<"$patches"

log "building ${bins[*]} from $version (nice 10); a cold build takes 15-30 minutes on 2 cores"
(cd "$tree" && GOPROXY=off nice -n 10 make KUBE_BUILD_PLATFORMS=linux/amd64 \
    GOFLAGS=-tags=providerless \
    WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet cmd/kubectl" >&2)

stage="$out.tmp"
rm -rf "$stage"
mkdir -p "$stage"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
    cp "$tree/_output/local/bin/linux/amd64/$b" "$stage/$b"
done
# The pod sandbox's image: no registry is reachable, so pause comes from the same tree.
gcc -Os -static -DVERSION=v3.4.1-ddpdeploy -o "$stage/pause" "$tree/build/pause/linux/pause.c"
strip "$stage/pause"
rm -rf "$out"
mv "$stage" "$out"
log "built in $(( $(date +%s) - start ))s"
echo "$out"
