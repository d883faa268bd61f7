#!/usr/bin/env bash
# Proof that .ci/cluster.sh leaves the machine as it found it: a snapshot, then up, a pod
# (CNI, an emptyDir in memory, cluster DNS), down, the same again, a second snapshot, and
# the diff of the two (empty when all is well). Prints the times of each step.
#   .ci/cluster-roundtrip.sh [ROUNDS]   (default 2)
# Run it with nothing else changing the machine's network meanwhile (another engine's
# containers would show in the diff). Needs root and what .ci/cluster.sh needs.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

bash .ci/cluster-snapshot.sh >"$out/before"
for r in $(seq "$rounds"); do
    t0=$(date +%s.%N)
    kubeconfig=$(bash .ci/cluster.sh up)
    t1=$(date +%s.%N)
    init=$(cat "$(dirname "$kubeconfig")/init-image")
    bash .ci/cluster.sh kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: roundtrip, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: probe
    image: $init
    command: [sh, -c, 'getent hosts kubernetes.default.svc.cluster.local && echo ok > /scratch/ok && sleep 1']
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {medium: Memory}}]
EOF
    phase=""
    for _ in $(seq 240); do
        phase=$(bash .ci/cluster.sh kubectl get pod roundtrip -o 'jsonpath={.status.phase}')
        [ "$phase" = Succeeded ] || [ "$phase" = Failed ] && break
        sleep 0.25
    done
    t2=$(date +%s.%N)
    bash .ci/cluster.sh down
    t3=$(date +%s.%N)
    awk -v r="$r" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v p="$phase" 'BEGIN {
        printf "round %d: up %.1f s, pod %s in %.1f s, down %.1f s\n", r, b - a, p, c - b, d - c }'
    [ "$phase" = Succeeded ] || { echo "the pod did not succeed ($phase)" >&2; exit 1; }
done
bash .ci/cluster-snapshot.sh >"$out/after"
if diff -u "$out/before" "$out/after"; then
    echo "the machine is as it was: the snapshots before up and after down are the same"
else
    echo "the machine changed (diff above)" >&2
    exit 1
fi
