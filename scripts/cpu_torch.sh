#!/usr/bin/env bash
# Sourced by .ci/run and scripts/verl_env.sh: install_cpu_torch installs the CPU build of torch
# into the active virtualenv when pip's find-links folder (/opt/wheels) holds one, which avoids
# gigabytes of CUDA wheels on a machine without a GPU. Elsewhere it does nothing and the extras
# install torch as usual.
install_cpu_torch() {
    local wheel version
    wheel="$(ls /opt/wheels/torch-*+cpu-*.whl 2>/dev/null | head -n 1 || true)"
    if [ -n "$wheel" ]; then
        version="$(basename "$wheel" | cut -d- -f2)"
        python -m pip install --quiet "torch==${version}"
    fi
}
