"""Running code in a fresh Python process, for determinism tests (``from _other_process import
...``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def json_from_other_process(code: str, *arguments: Any, hash_seed: str) -> Any:
    """The JSON that ``python -c code`` prints in a new process with ``PYTHONHASHSEED`` set to
    ``hash_seed``; each of ``arguments`` goes to it as one JSON command-line argument. The
    process must finish within 120 seconds and exit with status 0."""
    run = subprocess.run(
        [sys.executable, "-c", code, *(json.dumps(argument) for argument in arguments)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
        timeout=120,
    )
    return json.loads(run.stdout)
