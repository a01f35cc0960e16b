#!/usr/bin/env bash
# System packages some tests need (the local SLURM of tests/cluster/):
# installed with apt where this runs as root and apt exists; otherwise the
# tests that need them skip with the reason. Never fails the build.
set -u
need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system: not root or no apt-get: SLURM tests will skip (need: ${need[*]})" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q "${need[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${need[@]}" >/dev/null 2>&1; } \
    || echo "install_system: apt-get install ${need[*]} failed: SLURM tests will skip" >&2
exit 0
