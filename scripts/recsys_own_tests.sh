#!/usr/bin/env bash
# recsys-examples' own Karmarkar-Karp partitioner tests (examples/tests/commons/test_kk_partitioner.py)
# run against seqbalance's drop-in: the drop-in stands where the shuffler looks for its accelerated
# `karmarkar_karp(workloads, k, equal_size)` (the `kk_cpu_ops` extension), so the tests that check
# that path's contract (every index once, less spread than chunking, bad input refused, the GIL
# released while it runs) exercise ours. The parity tests, which require the accelerated partition
# to equal recsys-examples' own Python one bit for bit, are deselected: the drop-in returns a
# different partition whose heaviest rank is never heavier (docs/integrations.md).
#
# Usage: RECSYS_EXAMPLES=/path/to/recsys-examples scripts/recsys_own_tests.sh [pytest args]
set -euo pipefail
root="${RECSYS_EXAMPLES:?set RECSYS_EXAMPLES to a checkout of NVIDIA/recsys-examples}"
plugin_dir="$(mktemp -d)"
trap 'rm -rf "$plugin_dir"' EXIT
cat >"$plugin_dir/seqbalance_recsys_dropin.py" <<'PY'
import types


def pytest_configure(config):
    from commons.perf_model import partitioner

    from seqbalance.integrations.recsys import karmarkar_karp

    partitioner._kk_cpu_ops = types.SimpleNamespace(karmarkar_karp=karmarkar_karp)
PY
cd "$root/examples"
KK_FORCE_PYTHON=1 PYTHONPATH="$plugin_dir:$root/examples${PYTHONPATH:+:$PYTHONPATH}" \
    python -m pytest -q -p no:cacheprovider -p seqbalance_recsys_dropin \
    tests/commons/test_kk_partitioner.py -k "not parity" "$@"
