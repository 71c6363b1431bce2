#!/usr/bin/env bash
# The verl tests in verl 0.9.1's own environment: a virtualenv that pip's resolver builds from
# verl's declared requirements (transformers < 5.11, tensordict <= 0.10, ...; `pip check` must
# pass), so every verl module our docs tell users to edit imports as it does for a verl user.
# The main test environment has newer transformers / tensordict than verl allows, so verl is
# not installed there and these tests skip in it.
#
#   bash scripts/verl_env.sh            # makes (or reuses) .venv-verl, then runs the tests
#   VERL_VENV=/tmp/v bash scripts/verl_env.sh -x    # another folder; extra pytest arguments
#
# megatron-core goes in after `pip check`, without its dependencies, only so that verl's
# Megatron engine module (one of the six files that import verl.utils.seqlen_balancing) imports;
# it is not one of verl's requirements, and 0.19 declares Python >= 3.12 (README, Megatron).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/cpu_torch.sh
source scripts/cpu_torch.sh

venv="${VERL_VENV:-.venv-verl}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    python -m pip install --quiet --upgrade pip
    install_cpu_torch
    python -m pip install --quiet -e ".[verl-test]"
    python -m pip check
    python -m pip install --quiet --no-deps --ignore-requires-python \
        megatron-core==0.19.2 triton==3.9.0
else
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    python -m pip check
fi
python -c "import transformers, tensordict, verl; print('verl environment:', \
'verl', verl.__version__, 'transformers', transformers.__version__, \
'tensordict', tensordict.__version__)"
# -k verl: every test of the two verl modules, and the live verl tests of the stack baselines.
python -m pytest -q -k verl "$@" tests/integrations/test_integrations_verl_parity.py \
    tests/integrations/test_integrations_verl.py tests/integrations/test_integrations_verl_install.py \
    tests/integrations/test_integrations_verl_dynamic_cp.py tests/plan/test_plan_stacks.py
