#!/usr/bin/env bash
# Prints what .ci/cluster.sh up/down may change on this machine, normalised so that two
# snapshots diff clean when nothing changed: iptables (all tables, no counters), links,
# addresses and routes, sysctls (less the ones that tick by themselves), mounts, cgroup
# folders (two levels), the top of /etc, /run, /var/lib, /var/log, /var/cache, listening
# ports below the ephemeral range, the kube/etcd processes, Docker containers and images.
# .ci/cluster-roundtrip.sh diffs one taken before up with one taken after down. Needs root.
set -uo pipefail

section() { printf '\n## %s\n' "$1"; }

section iptables
for t in filter nat mangle raw; do
    iptables-save -t "$t" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
done
section ip6tables
for t in filter nat mangle raw; do
    ip6tables-save -t "$t" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
done
section links # name and kind; carrier state changes with other engines' containers
ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -v '^veth' | sort
section addresses
ip -o addr show | awk '{print $2, $3, $4}' | grep -v '^veth' | sort
section routes
ip route show table all | grep -v -E 'veth|^local .* dev veth' | sort
section sysctl
sysctl -a 2>/dev/null | grep -v -E \
    '^(kernel\.random|fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota)|kernel\.ns_last_pid|net\.netfilter\.nf_conntrack_count|kernel\.pty\.nr|vm\.stat_refresh|kernel\.sched_domain|net\.ipv[46]\.(conf|neigh)\.veth|dev\.cdrom)' |
    sort
section mounts
awk '{print $1, $2, $3}' /proc/mounts | grep -v -E '/var/lib/docker/(overlay2|containers)|/run/docker/netns' | sort
section cgroups
find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d 2>/dev/null | sort
for d in /etc /run /var/run /var/lib /var/log /var/cache /var/lib/cni /etc/cni; do
    section "ls $d"
    # shellcheck disable=SC2012 # names only, as ls shows them
    ls -A "$d" 2>/dev/null | sort
done
section listening # ports below the ephemeral range: fixed services, not passing test servers
ss -Hlntu 2>/dev/null | awk '{print $1, $5}' |
    awk '{n = split($2, a, ":"); if (a[n] + 0 < 32768) print}' | sort -u
section processes # of a cluster.sh cluster: each names its state folder or address
# shellcheck disable=SC2009 # whole command lines, not names: pgrep -a would do, less plainly
ps -eo args= | grep -E '/var/lib/ddpdeploy-cluster|10\.213\.0\.1|(^|/)kubelet ' |
    grep -v -E 'grep|cluster-snapshot' | sort
section containers
docker ps -a --format '{{.Names}} {{.Image}}' 2>/dev/null | sort
section images
docker images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | sort
section networks
docker network ls --format '{{.Name}}' 2>/dev/null | sort
