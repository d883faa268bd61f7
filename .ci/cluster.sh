#!/usr/bin/env bash
# A real single-node Kubernetes 1.20 for the e2e tests (tests/e2e), on this machine:
#
#   .ci/cluster.sh up       bring it up; prints the admin kubeconfig's path on stdout
#   .ci/cluster.sh down     take it down and put the machine back as it was (also after a
#                           killed run: a stale state folder is enough)
#   .ci/cluster.sh status   "up <kubeconfig>" or "down" (exit 0 / 3)
#   .ci/cluster.sh kubectl ARGS...   the built kubectl against it
#
# Real: etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager, kube-scheduler
# and the kubelet on dockershim against the running Docker engine (all from .ci/kube-build.sh),
# CNI (bridge, host-local, firewall from containernetworking-plugins) on a private bridge, a
# pause image imported from the built static pause, a default StorageClass with local
# PersistentVolumes. Played: cluster DNS (tests/e2e/cluster_dns.py, dnslib, instead of CoreDNS) and
# the Kubeflow training operator (tests/e2e/operator.py). See docs/ci.md.
#
# Everything listens on the bridge's own address ($NODE_IP) and nowhere else; pods reach
# nothing but each other and that address. One cluster per machine (the 1.20 kubelet writes
# fixed paths such as /var/run/dockershim.sock). Needs root.
#
# Settings (environment):
#   DDPDEPLOY_KUBE_BIN        the folder .ci/kube-build.sh printed (default: the newest
#                             complete one in /var/cache/ddpdeploy-test)
#   DDPDEPLOY_CLUSTER_DIR     state (pki, etcd, kubelet root, logs, pids, volumes); default
#                             /var/lib/ddpdeploy-cluster; the kubeconfig is admin.kubeconfig in it
#   DDPDEPLOY_CLUSTER_PYTHON  a python with dnslib and kubernetes (pip install -e '.[dev]');
#                             default: python3 on PATH
#   DDPDEPLOY_CLUSTER_BY      who brings it up (kept in the state folder as `by`; the test
#                             fixture says "pytest"), default "hand"
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STATE=${DDPDEPLOY_CLUSTER_DIR:-/var/lib/ddpdeploy-cluster}
CACHE=${DDPDEPLOY_KUBE_CACHE:-/var/cache/ddpdeploy-test}
LOCK=/run/lock/ddpdeploy-cluster.lock
NODE=ddpdeploy-node
BRIDGE=ddpk8s0
# A /23 of its own: pods in the lower half, service IPs (never routed: no kube-proxy;
# headless services need none) in the upper. Docker's pools are 172.17-31/16 and 192.168/16.
NET=10.213.0.0/23
POD_CIDR=10.213.0.0/24
NODE_IP=10.213.0.1
SVC_CIDR=10.213.1.0/24
API_PORT=6443
ETCD_PORT=2379
ETCD_PEER_PORT=2380
PORTS=(53 "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" 10248 10250 10257 10259 9443)
# Paths the 1.20 kubelet writes whatever --root-dir says; removed by down unless they were
# there before up.
FIXED_PATHS=(/var/log/pods /var/log/containers /var/lib/kubelet)
DOCKERSHIM_SOCK=/var/run/dockershim.sock
# Host-wide tunables an unpatched kubelet rewrites (.ci/kube-build.sh's patch makes it
# only warn); saved by up, put back by down.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
# Processes in start order; down stops them in reverse.
PROCS=(etcd kube-apiserver kube-controller-manager kube-scheduler dns operator kubelet)
CRD="$ROOT/tests/schemas/kubeflow.org_pytorchjobs.yaml"
PV_COUNT=8
PV_SIZE=5Gi

log() { echo "cluster.sh: $*" >&2; }
die() {
    log "$*"
    exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

find_bin() {
    if [ -n "${DDPDEPLOY_KUBE_BIN:-}" ]; then
        echo "$DDPDEPLOY_KUBE_BIN"
        return
    fi
    local d best=""
    for d in "$CACHE"/kube-[0-9]*; do # the newest complete build
        [ -x "$d/kubelet" ] && [ -x "$d/kube-apiserver" ] && [ -x "$d/pause" ] || continue
        if [ -z "$best" ] || [ "$d" -nt "$best" ]; then best=$d; fi
    done
    echo "$best"
}
BIN=$(find_bin)
KUBECTL="$BIN/kubectl"
PY=${DDPDEPLOY_CLUSTER_PYTHON:-$(command -v python3 || true)}
k() { "$KUBECTL" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# ------------------------------------------------------------------ processes (by PID file)
# A PID file holds "PID STARTTIME": a stale file from a killed run never names a stranger
# that got the same PID since.
# A zombie (state Z) counts as gone: whoever reaps orphans here may take seconds to do it.
proc_start() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '$1 != "Z" {print $20}'; }
ours_alive() {
    local f="$STATE/pids/$1" pid start
    [ -f "$f" ] || return 1
    read -r pid start <"$f"
    [ -n "$pid" ] && [ "$(proc_start "$pid")" = "$start" ]
}
spawn() { # name cmd...: detached (setsid), logs in $STATE/logs/<name>.log
    local name=$1 pid
    shift
    # 8>&-: the lock's descriptor stays with this script (a daemon holding it would block
    # every later up and down).
    setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null 8>&- &
    pid=$!
    echo "$pid $(proc_start "$pid")" >"$STATE/pids/$name"
}
stop_proc() { # name: TERM, up to 3 s, then KILL; only a process up started. (Nothing
    # here keeps state worth a longer wait: the apiserver, for one, lingers for 20 s after
    # it stopped serving, trying to unregister itself from the apiserver.)
    local f="$STATE/pids/$1" pid start i
    [ -f "$f" ] || return 0
    read -r pid start <"$f"
    if ours_alive "$1"; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 15); do
            [ "$(proc_start "$pid")" = "$start" ] || break
            sleep 0.2
        done
        if [ "$(proc_start "$pid")" = "$start" ]; then
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi
    rm -f "$f"
}

# ------------------------------------------------------------------ containers dockershim made
# Only this cluster's: pod sandboxes run our pause image; every other container names its
# sandbox in a label. Another kubelet's containers on the same engine are never touched.
our_containers() { # [running]: only running ones
    local pause sandboxes all=-a
    [ "${1:-}" = running ] && all=
    pause=$(cat "$STATE/pause-image" 2>/dev/null || true)
    [ -n "$pause" ] || return 0
    sandboxes=$(docker ps $all -q --no-trunc --filter "ancestor=$pause" \
        --filter label=io.kubernetes.docker.type=podsandbox 2>/dev/null || true)
    [ -n "$sandboxes" ] || return 0
    echo "$sandboxes"
    [ -n "$all" ] || return 0
    docker ps -a --no-trunc --filter label=io.kubernetes.docker.type=container \
        --format '{{.ID}} {{.Label "io.kubernetes.sandbox.id"}}' |
        awk 'NR == FNR { s[$1] = 1; next } ($2 in s) { print $1 }' <(echo "$sandboxes") -
}

# ------------------------------------------------------------------ preflight
overlaps() { # CIDR: is any route or address on the machine inside or around it?
    ip -4 route show table all | awk '{print $1}' | grep -E '^[0-9]' |
        "$PY" -c '
import ipaddress, sys
net = ipaddress.ip_network(sys.argv[1])
for line in sys.stdin:
    word = line.strip()
    if word == "default" or not word:
        continue
    other = ipaddress.ip_network(word if "/" in word else word + "/32", strict=False)
    if other.prefixlen > 0 and net.overlaps(other):
        print(word)
' "$1"
}

preflight() {
    [ "$(id -u)" = 0 ] || die "needs root (it runs a kubelet, makes a bridge and iptables rules)"
    [ -n "$BIN" ] || die "no Kubernetes binaries: run .ci/kube-build.sh (it prints the folder)" \
        "or set DDPDEPLOY_KUBE_BIN"
    local b
    for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl pause; do
        [ -x "$BIN/$b" ] || die "$BIN/$b missing (run .ci/kube-build.sh)"
    done
    command -v etcd >/dev/null || die "etcd missing (apt-get install etcd-server)"
    for b in bridge host-local firewall loopback; do
        [ -x "/usr/lib/cni/$b" ] || die "CNI plugin $b missing (apt-get install containernetworking-plugins)"
    done
    command -v openssl >/dev/null || die "openssl missing"
    if [ -z "$PY" ] || ! "$PY" -c 'import dnslib, kubernetes' 2>/dev/null; then
        die "${PY:-python3} lacks dnslib or kubernetes (pip install -e '.[dev]', or set DDPDEPLOY_CLUSTER_PYTHON)"
    fi
    docker info >/dev/null 2>&1 || die "no Docker engine answers (run .ci/docker-setup.sh)"
    # What would clash: a cluster of ours already (or its leftovers), another kubelet on this
    # Docker engine (two dockershims kill each other's pods), our network, our ports.
    [ -e "$STATE" ] && die "$STATE exists: a cluster is up, or a killed one left it; run .ci/cluster.sh down"
    [ -S "$DOCKERSHIM_SOCK" ] && die "$DOCKERSHIM_SOCK exists: another kubelet runs on this machine"
    local other
    other=$(docker ps -aq --filter label=io.kubernetes.docker.type | head -n 3 | tr '\n' ' ')
    [ -z "$other" ] || die "the Docker engine holds another kubelet's pod containers ($other); one kubelet per engine"
    ip link show "$BRIDGE" >/dev/null 2>&1 && die "a link named $BRIDGE exists already"
    other=$(overlaps "$NET" | tr '\n' ' ')
    [ -z "$other" ] || die "$NET clashes with routes on this machine: $other"
    local port
    for port in "${PORTS[@]}"; do
        if ss -Hlntu "( sport = :$port )" | awk '{print $5}' | grep -qE '^(0\.0\.0\.0|\*|\[::\]):'; then
            die "port $port is taken on every address (our services listen on $NODE_IP:$port)"
        fi
    done
}

# ------------------------------------------------------------------ PKI and kubeconfigs
pki() {
    local P="$STATE/pki"
    mkdir -p "$P"
    cd "$P"
    # EC keys: a tenth of RSA's time, and every component of 1.20 takes them.
    key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null; }
    key ca
    openssl req -x509 -new -key ca.key -subj /CN=ddpdeploy-e2e-ca -days 7 -out ca.crt \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    key sa
    openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
    cert() { # name CN O SANs(or "")
        local subj="/CN=$2"
        [ -n "$3" ] && subj="/O=$3/CN=$2"
        key "$1"
        {
            echo "basicConstraints=CA:FALSE"
            echo "keyUsage=critical,digitalSignature,keyEncipherment"
            if [ -n "$4" ]; then
                echo "extendedKeyUsage=serverAuth,clientAuth"
                echo "subjectAltName=$4"
            else
                echo "extendedKeyUsage=clientAuth"
            fi
        } >"$1.ext"
        openssl req -new -key "$1.key" -subj "$subj" |
            openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
                -extfile "$1.ext" -out "$1.crt" 2>/dev/null
        rm -f "$1.ext"
    }
    local svc1
    svc1=$("$PY" -c "import ipaddress; print(ipaddress.ip_network('$SVC_CIDR')[1])")
    cert apiserver kube-apiserver "" "IP:$NODE_IP,IP:$svc1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters ""
    cert front-proxy-client front-proxy-client "" ""
    cert admin ddpdeploy-e2e-admin system:masters ""
    cert controller-manager system:kube-controller-manager "" ""
    cert scheduler system:kube-scheduler "" ""
    cert kubelet "system:node:$NODE" system:nodes ""
    cert kubelet-serving "$NODE" "" "IP:$NODE_IP,DNS:$NODE"
    cert dns ddpdeploy-e2e-dns "" ""
    cert operator ddpdeploy-e2e-operator "" ""
    cert webhook ddpdeploy-e2e-webhook "" "IP:$NODE_IP"
    cd - >/dev/null
    local who
    for who in admin controller-manager scheduler kubelet dns operator; do
        cat >"$STATE/$who.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: ddpdeploy-e2e
  cluster:
    server: https://$NODE_IP:$API_PORT
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: $who
  user:
    client-certificate-data: $(base64 -w0 "$P/$who.crt")
    client-key-data: $(base64 -w0 "$P/$who.key")
contexts:
- name: ddpdeploy-e2e
  context: {cluster: ddpdeploy-e2e, user: $who}
current-context: ddpdeploy-e2e
KC
        chmod 600 "$STATE/$who.kubeconfig"
    done
}

# ------------------------------------------------------------------ images
# The pod sandbox (pause, built static by kube-build.sh) and the operator's worker init
# container (sh, getent, seq, sleep from this host, with their libc: alpine:3.10, the real
# one's image, cannot be pulled here) share one tiny image, tagged twice.
images() {
    local key t f
    key=$(cat "$BIN/pause" /usr/bin/getent /usr/bin/dash /usr/bin/seq /usr/bin/sleep \
        /lib/x86_64-linux-gnu/libc.so.6 | sha256sum | cut -c1-12)
    echo "ddpdeploy-test/cluster-pause:$key" >"$STATE/pause-image"
    echo "ddpdeploy-test/cluster-init:$key" >"$STATE/init-image"
    if docker image inspect "ddpdeploy-test/cluster-pause:$key" >/dev/null 2>&1; then
        docker tag "ddpdeploy-test/cluster-pause:$key" "ddpdeploy-test/cluster-init:$key"
        return
    fi
    t=$(mktemp -d)
    mkdir -p "$t"/{bin,usr/bin,lib/x86_64-linux-gnu,lib64,etc,tmp}
    cp "$BIN/pause" "$t/pause"
    cp /usr/bin/dash "$t/bin/sh"
    for f in getent seq sleep; do cp "/usr/bin/$f" "$t/usr/bin/$f"; done
    cp /lib/x86_64-linux-gnu/libc.so.6 "$t/lib/x86_64-linux-gnu/"
    cp /lib64/ld-linux-x86-64.so.2 "$t/lib64/"
    echo "hosts: files dns" >"$t/etc/nsswitch.conf"
    chmod 1777 "$t/tmp"
    tar -C "$t" --numeric-owner --owner=0 --group=0 -c . |
        docker import -c 'ENTRYPOINT ["/pause"]' \
            -c 'ENV PATH=/usr/bin:/bin' - "ddpdeploy-test/cluster-pause:$key" >/dev/null
    docker tag "ddpdeploy-test/cluster-pause:$key" "ddpdeploy-test/cluster-init:$key"
    rm -rf "$t"
}

# ------------------------------------------------------------------ objects the cluster starts with
bootstrap_objects() {
    local i
    cat <<EOF
# The DNS server reads Services and Endpoints, as CoreDNS's system:coredns role does.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ddpdeploy-e2e-dns}
rules:
- {apiGroups: [""], resources: [services, endpoints], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ddpdeploy-e2e-dns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ddpdeploy-e2e-dns}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: ddpdeploy-e2e-dns}]
---
# The operator stand-in: what training-operator's ClusterRole grants for PyTorchJobs, and
# PersistentVolumes for the local volumes it recycles.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ddpdeploy-e2e-operator}
rules:
- {apiGroups: [kubeflow.org], resources: [pytorchjobs, pytorchjobs/status, pytorchjobs/finalizers], verbs: ["*"]}
- {apiGroups: [""], resources: [pods, services], verbs: [get, list, watch, create, delete]}
- {apiGroups: [""], resources: [events], verbs: [create, patch]}
- {apiGroups: [""], resources: [persistentvolumes], verbs: [get, list, watch, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ddpdeploy-e2e-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ddpdeploy-e2e-operator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: ddpdeploy-e2e-operator}]
---
# Local volumes on the node, bound when a pod is scheduled (as local volumes are); the
# default class, so a PVC without storageClassName gets one too.
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
    for i in $(seq 0 $((PV_COUNT - 1))); do
        cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: local-pv-$i
  labels: {ddpdeploy.dev/e2e-volume: "true"}
spec:
  capacity: {storage: $PV_SIZE}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: standard
  local: {path: $STATE/volumes/pv-$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
EOF
    done
    # The operator's validating webhook (the real one's rules, served by operator.py).
    cat <<EOF
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validator.training-operator.kubeflow.org}
webhooks:
- name: validator.pytorchjob.training-operator.kubeflow.org
  admissionReviewVersions: [v1]
  sideEffects: None
  failurePolicy: Fail
  timeoutSeconds: 10
  clientConfig:
    url: https://$NODE_IP:9443/validate-kubeflow-org-v1-pytorchjob
    caBundle: $(base64 -w0 "$STATE/pki/ca.crt")
  rules:
  - {apiGroups: [kubeflow.org], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pytorchjobs]}
EOF
}

# ------------------------------------------------------------------ up
wait_for() { # seconds what command...: poll every 0.25 s
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        [ "$(date +%s)" -lt "$deadline" ] || die "$what: not within ${secs}s"
        local p
        for p in "${PROCS[@]}"; do
            if [ -f "$STATE/pids/$p" ] && ! ours_alive "$p"; then
                die "$p exited: $(tail -n 5 "$STATE/logs/$p.log")"
            fi
        done
        sleep 0.25
    done
}
crd_established() {
    [ "$(k get crd pytorchjobs.kubeflow.org \
        -o 'jsonpath={.status.conditions[?(@.type=="Established")].status}')" = True ]
}
node_ready() {
    [ "$(k get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

up() {
    local t0
    t0=$(now)
    preflight
    mkdir -p "$STATE"/{pids,logs,cni-net.d,cni-ipam,cni-cache,kubelet,dockershim,etcd,volumes}
    chmod 700 "$STATE"
    touch "$STATE/preexisting"
    local d s
    for d in "${FIXED_PATHS[@]}"; do [ -e "$d" ] && echo "$d" >>"$STATE/preexisting"; done
    for d in /sys/fs/cgroup/*/kubepods; do [ -e "$d" ] && echo "$d" >>"$STATE/preexisting"; done
    iptables -S CNI-FORWARD >/dev/null 2>&1 && echo CNI-FORWARD >>"$STATE/preexisting"
    iptables -S CNI-ADMIN >/dev/null 2>&1 && echo CNI-ADMIN >>"$STATE/preexisting"
    for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$STATE/sysctl.saved"
    # Who asked: a test session's cluster found up later is a killed session's leftover.
    echo "${DDPDEPLOY_CLUSTER_BY:-hand}" >"$STATE/by"
    # A failure from here on (an error or a die) takes down what was made.
    UP_DONE=0
    trap '[ "$UP_DONE" = 1 ] || { log "up failed; taking down what it made"; down >&2 || true; }' EXIT

    pki
    images
    for d in $(seq 0 $((PV_COUNT - 1))); do mkdir -p "$STATE/volumes/pv-$d"; done

    # The bridge first: the apiserver, kubelet and DNS bind its address before any pod exists.
    ip link add "$BRIDGE" type bridge
    ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    cat >"$STATE/cni-net.d/10-ddpdeploy.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "ddpdeploy-e2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$STATE/cni-ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "firewall", "backend": "iptables"}
  ]
}
EOF

    local P="$STATE/pki"
    spawn etcd etcd --name ddpdeploy-e2e --data-dir "$STATE/etcd" \
        --listen-client-urls "http://$NODE_IP:$ETCD_PORT" \
        --advertise-client-urls "http://$NODE_IP:$ETCD_PORT" \
        --listen-peer-urls "http://$NODE_IP:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://$NODE_IP:$ETCD_PEER_PORT" \
        --initial-cluster "ddpdeploy-e2e=http://$NODE_IP:$ETCD_PEER_PORT" --unsafe-no-fsync
    spawn kube-apiserver "$BIN/kube-apiserver" \
        --etcd-servers="http://$NODE_IP:$ETCD_PORT" \
        --bind-address="$NODE_IP" --advertise-address="$NODE_IP" \
        --secure-port="$API_PORT" --insecure-port=0 \
        --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
        --client-ca-file="$P/ca.crt" \
        --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$P/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$P/ca.crt" \
        --kubelet-preferred-address-types=InternalIP \
        --authorization-mode=Node,RBAC \
        --enable-admission-plugins=NodeRestriction \
        --service-cluster-ip-range="$SVC_CIDR" \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$P/sa.pub" \
        --service-account-signing-key-file="$P/sa.key" \
        --requestheader-client-ca-file="$P/ca.crt" \
        --requestheader-allowed-names=front-proxy-client \
        --requestheader-username-headers=X-Remote-User \
        --requestheader-group-headers=X-Remote-Group \
        --requestheader-extra-headers-prefix=X-Remote-Extra- \
        --proxy-client-cert-file="$P/front-proxy-client.crt" \
        --proxy-client-key-file="$P/front-proxy-client.key" \
        --profiling=false
    wait_for 90 "the apiserver's /readyz" k get --raw /readyz
    log "apiserver ready after $(since "$t0")s"

    bootstrap_objects | k apply -f - >/dev/null
    # 1.20 knows no x-kubernetes-validations (the CRD's one CEL rule): kubectl's own schema
    # check refuses the file, the apiserver drops the field. The real CRD otherwise, as is.
    k create --validate=false -f "$CRD" >/dev/null

    spawn kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --bind-address="$NODE_IP" --port=0 --secure-port=10257 \
        --leader-elect=false \
        --use-service-account-credentials=true \
        --service-account-private-key-file="$P/sa.key" \
        --root-ca-file="$P/ca.crt" \
        --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
        --service-cluster-ip-range="$SVC_CIDR" \
        --cluster-name=ddpdeploy-e2e \
        --controllers='*,-service,-cloud-node-lifecycle,-route' \
        --profiling=false
    spawn kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig="$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
        --bind-address="$NODE_IP" --port=0 --secure-port=10259 \
        --leader-elect=false --profiling=false
    spawn dns "$PY" "$ROOT/tests/e2e/cluster_dns.py" --listen "$NODE_IP" --port 53 \
        --kubeconfig "$STATE/dns.kubeconfig" --zone cluster.local
    spawn operator "$PY" "$ROOT/tests/e2e/operator.py" \
        --kubeconfig "$STATE/operator.kubeconfig" \
        --init-image "$(cat "$STATE/init-image")" \
        --webhook "$NODE_IP:9443" --webhook-cert "$P/webhook.crt" --webhook-key "$P/webhook.key" \
        --volumes "$STATE/volumes"

    cat >"$STATE/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: $NODE_IP
healthzPort: 10248
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: $(docker info --format '{{.CgroupDriver}}')
failSwapOn: false
# Never delete images: the Docker engine is shared (other tests' images live there).
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, nodefs.inodesFree: 1%, imagefs.available: 1%}
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
# No KUBE-* chains in the host's iptables (there is no kube-proxy either).
makeIPTablesUtilChains: false
hairpinMode: hairpin-veth
maxPods: 30
serializeImagePulls: false
EOF
    spawn kubelet "$BIN/kubelet" \
        --config="$STATE/kubelet-config.yaml" \
        --kubeconfig="$STATE/kubelet.kubeconfig" \
        --hostname-override="$NODE" --node-ip="$NODE_IP" \
        --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" \
        --container-runtime=docker \
        --experimental-dockershim-root-directory="$STATE/dockershim" \
        --pod-infra-container-image="$(cat "$STATE/pause-image")" \
        --network-plugin=cni --cni-bin-dir=/usr/lib/cni --cni-conf-dir="$STATE/cni-net.d" \
        --cni-cache-dir="$STATE/cni-cache" \
        --volume-plugin-dir="$STATE/kubelet/volume-plugins" \
        --oom-score-adj=0 --v=1

    # (kubectl 1.20's `wait --for condition=established` fails outright on a CRD whose
    # status has no conditions yet.)
    wait_for 60 "the PyTorchJob CRD Established" crd_established
    wait_for 90 "node $NODE Ready" node_ready
    # Pods need their namespace's default ServiceAccount (the controller-manager makes it).
    wait_for 60 "the default ServiceAccount" k get serviceaccount default -n default
    UP_DONE=1
    log "up in $(since "$t0")s: export KUBECONFIG=$STATE/admin.kubeconfig" \
        "(kubectl: .ci/cluster.sh kubectl ...; logs: $STATE/logs)"
    echo "$STATE/admin.kubeconfig"
}

# ------------------------------------------------------------------ down
down() {
    # Best effort through every step (a killed run leaves any mix of them); the check at
    # the end says what is left.
    set +e +o pipefail
    local t0
    t0=$(now)
    if [ ! -d "$STATE" ]; then
        log "nothing to take down ($STATE absent)"
        return 0
    fi
    # 1. Pods away through the kubelet, so CNI DEL releases their addresses and rules.
    if ours_alive kube-apiserver && ours_alive kubelet; then
        k delete pods --all --all-namespaces --grace-period=0 --force --wait=false \
            >/dev/null 2>&1 || true
        # A stopped sandbox has had its network torn down (CNI DEL); the kubelet removes
        # the exited containers only at its next garbage collection, step 3 does it now.
        local i
        for i in $(seq 120); do
            [ -z "$(our_containers running | head -n 1)" ] && break
            sleep 0.25
        done
    fi
    # 2. Our processes, by PID file: the kubelet first, then the rest at once (the apiserver
    #    alone may take seconds to drain).
    stop_proc kubelet
    local name
    for name in "${PROCS[@]}"; do stop_proc "$name" & done
    wait
    # 3. Containers of ours the kubelet did not get to remove.
    local left
    left=$(our_containers | tr '\n' ' ')
    if [ -n "${left// /}" ]; then
        # shellcheck disable=SC2086
        docker rm -f $left >/dev/null 2>&1 || true
    fi
    # 4. Mounts under the state folder (emptyDirs, the kubelet's rshared root), deepest first.
    local m
    awk '{print $2}' /proc/mounts | grep -E "^$STATE(/|$)" | sort -r | while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    # 5. Network: the bridge, then the firewall plugin's rules for our pods; its chains too
    #    when up made them.
    ip link del "$BRIDGE" 2>/dev/null || true
    local chain rule
    for chain in CNI-FORWARD CNI-ADMIN; do
        iptables -S "$chain" 2>/dev/null | grep -F -- "${POD_CIDR%.*}." | sed 's/^-A /-D /' |
            while read -r rule; do
                # shellcheck disable=SC2086
                eval iptables $rule 2>/dev/null || true
            done
    done
    if ! grep -qx CNI-FORWARD "$STATE/preexisting" 2>/dev/null; then
        while iptables -D FORWARD -m comment --comment "CNI firewall plugin rules" \
            -j CNI-FORWARD 2>/dev/null; do :; done
        iptables -F CNI-FORWARD 2>/dev/null && iptables -X CNI-FORWARD 2>/dev/null || true
    fi
    if ! grep -qx CNI-ADMIN "$STATE/preexisting" 2>/dev/null; then
        iptables -F CNI-ADMIN 2>/dev/null && iptables -X CNI-ADMIN 2>/dev/null || true
    fi
    # 6. The kubelet's cgroups (cgroupfs driver): /kubepods in every hierarchy, deepest first.
    for d in /sys/fs/cgroup/*/kubepods; do
        [ -d "$d" ] || continue
        grep -qx "$d" "$STATE/preexisting" 2>/dev/null && continue
        find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    # 7. Kernel tunables, where they changed.
    local s v
    if [ -f "$STATE/sysctl.saved" ]; then
        while IFS='=' read -r s v; do
            [ "$(sysctl -n "$s" 2>/dev/null)" = "$v" ] || sysctl -qw "$s=$v" || true
        done <"$STATE/sysctl.saved"
    fi
    # 8. The fixed paths the kubelet wrote outside the state folder.
    for d in "${FIXED_PATHS[@]}"; do
        grep -qx "$d" "$STATE/preexisting" 2>/dev/null || rm -rf "$d"
    done
    rm -f "$DOCKERSHIM_SOCK"
    # 9. Our two image tags (one tiny image), unless a container still uses them.
    for f in pause-image init-image; do
        [ -f "$STATE/$f" ] && docker rmi "$(cat "$STATE/$f")" >/dev/null 2>&1 || true
    done
    rm -rf "$STATE"
    # Check: nothing of ours is left.
    local leftovers=()
    ip link show "$BRIDGE" >/dev/null 2>&1 && leftovers+=("link $BRIDGE")
    iptables -S 2>/dev/null | grep -qF -- "${POD_CIDR%.*}." && leftovers+=("iptables rules for $POD_CIDR")
    [ -e "$STATE" ] && leftovers+=("$STATE")
    if [ ${#leftovers[@]} -gt 0 ]; then
        log "down left: ${leftovers[*]}"
        return 1
    fi
    log "down in $(since "$t0")s"
}

status() {
    if ours_alive kube-apiserver && ours_alive kubelet; then
        echo "up $STATE/admin.kubeconfig"
        return 0
    fi
    if [ -e "$STATE" ]; then
        echo "broken (run .ci/cluster.sh down)"
        return 3
    fi
    echo down
    return 3
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
up | down)
    # One bring-up or teardown at a time on this machine.
    exec 8>"$LOCK"
    flock -w 300 8 || die "another .ci/cluster.sh holds $LOCK"
    "$cmd"
    ;;
status) status ;;
kubectl) exec "$KUBECTL" --kubeconfig "$STATE/admin.kubeconfig" "$@" ;;
*)
    echo "usage: .ci/cluster.sh up|down|status|kubectl ARGS..." >&2
    exit 2
    ;;
esac
