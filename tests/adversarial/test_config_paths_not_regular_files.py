"""Adversarial (adv9b P11): a path read as a model config or as verl's installation settings
that is no regular file hung or filled the memory. ``ModelSpec.from_hf_config(path)`` of a FIFO
(a config written by another process through a pipe) blocked in open() for ever, of /dev/zero
read until MemoryError; ``$SEQBALANCE_VERL_OPTIONS`` naming a FIFO blocked ``install()``
(Ray's worker_process_setup_hook: the worker never starts, the job hangs), /dev/zero filled the
memory. Now both are a ValueError naming the path, before any read. (Only the FIFO is exercised
here: /dev/zero would fill the test machine's memory on the code before the fix.)"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from seqbalance import ModelSpec
from seqbalance.integrations.verl import ENV_OPTIONS, install


def _returns_in_time(call: Callable[[], None], fifo: Path) -> BaseException | None:
    """What ``call`` raised (None: returned), failing the test if it blocks."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # handed to the test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY))  # let the blocked reader go (end of file)
        thread.join(timeout=20)
        pytest.fail("blocked reading a FIFO")
    return outcome[0]


def test_a_config_fifo_is_a_value_error(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    error = _returns_in_time(lambda: ModelSpec.from_hf_config(fifo), fifo)
    assert isinstance(error, ValueError) and "not a regular file" in str(error), error


def test_verl_settings_in_a_fifo_are_a_value_error(tmp_path, monkeypatch) -> None:
    fifo = tmp_path / "options.json"
    os.mkfifo(fifo)
    monkeypatch.setenv(ENV_OPTIONS, str(fifo))
    error = _returns_in_time(install, fifo)
    assert isinstance(error, ValueError) and "not a regular file" in str(error), error


def test_verl_settings_file_not_utf8_is_named(tmp_path, monkeypatch) -> None:
    # adv14d D15: a UTF-16 settings file raised the codec's bare "'utf-8' codec can't decode
    # byte 0xff", naming neither the variable nor the file.
    options = tmp_path / "options.json"
    options.write_bytes("{}".encode("utf-16"))
    monkeypatch.setenv(ENV_OPTIONS, str(options))
    with pytest.raises(ValueError, match=rf"^\${ENV_OPTIONS} = {str(options)!r} is neither"):
        install()
