#!/usr/bin/env bash
# System packages some tests need (the local SLURM of tests/cluster/, the
# headless browser of tests/render/test_html_render.py): installed with apt
# where this runs as root and apt exists; otherwise the tests that need
# them skip with the reason. Never fails the build; one group failing does
# not keep the other out.
set -u
groups=()
{ command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; } || groups+=("slurm-wlm munge")
{ command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; } || groups+=("chromium")
[ ${#groups[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system: not root or no apt-get: SLURM / browser tests will skip (need: ${groups[*]})" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
updated=0
for g in "${groups[@]}"; do
    # shellcheck disable=SC2086
    apt-get install -y -q $g >/dev/null 2>&1 && continue
    if [ $updated = 0 ]; then apt-get update -q >/dev/null 2>&1; updated=1; fi
    # shellcheck disable=SC2086
    apt-get install -y -q $g >/dev/null 2>&1 \
        || echo "install_system: apt-get install $g failed: the tests that need it will skip" >&2
done
exit 0
