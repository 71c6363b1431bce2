"""Adversarial (adv16b D7): the CLI's ``.npy`` lengths reader (``plan`` / ``simulate`` /
``bench`` LENGTHS, ``--lengths``) mapped the file, then copied the map: a file cut by another
process meanwhile (``seqbalance lengths ... -o`` or ``np.save`` rewriting it: both truncate
first) killed the command with SIGBUS (exit -7), where the samplers' readers say a ValueError.
Now the values are read from the file, and a file cut, replaced or rewritten while it is read
is one line, exit 2. In a child process (a signal would end pytest); the cut is made where the
other process's rewrite would land, just after the map."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from _other_process import run_process_tree

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import seqbalance.cli._lengths_file as reader
    from seqbalance.cli import main

    path = sys.argv[1]
    np.save(path, np.arange(1, 200_001, dtype=np.int64))
    mapped = reader.map_npy

    def mapped_then_cut(source):
        array = mapped(source)
        os.truncate(source, 200)  # another process rewrites the file
        return array

    reader.map_npy = mapped_then_cut
    sys.exit(main(["plan", path, "--dp", "2", "--global-batch", "64"]))
    """
)


def test_a_lengths_file_cut_while_it_is_read_is_one_line(tmp_path: Path) -> None:
    done = run_process_tree(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "lengths.npy")], timeout=120
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines() == [
        f"seqbalance plan: error: LENGTHS: '{tmp_path / 'lengths.npy'}' changed while it was "
        "read (cut, replaced or rewritten by another process?); read it again once it is written"
    ]
