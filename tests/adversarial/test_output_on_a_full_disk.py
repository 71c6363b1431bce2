"""Adversarial (adv14d D12): an output on a full disk (``plan ... -o plan.json``, ``lengths ...
-o L.npy``) failed with "[Errno 28] No space left on device" alone: a full disk fails the write
or the close, not the open, so the error names no file, and the command none either. The flag
and the file are named now. /dev/full stands in for the full disk."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from seqbalance.cli import main
from seqbalance.cli._output import write_output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_names_the_output(tmp_path: Path, capsys) -> None:
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello world"}\n')
    for name, argv in (
        ("full.json", ["plan", str(lengths), "--dp", "2"]),
        ("full.npy", ["lengths", str(data)]),
    ):
        full = tmp_path / name
        full.symlink_to("/dev/full")
        assert main([*argv, "-o", str(full)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"-o/--output {str(full)!r}: cannot write it: No space left on device" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_an_output_the_open_refuses_names_the_flag(tmp_path: Path, capsys) -> None:
    """adv15b D14: ``-o /proc/self/x`` (a folder that exists, where no file can be made) said
    "[Errno 2] No such file or directory: '/proc/self/x'", naming no flag."""
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    assert main(["plan", str(lengths), "--dp", "2", "-o", "/proc/self/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "-o/--output '/proc/self/x': cannot write it: No such file or directory" in err, err


def test_a_write_cut_short_leaves_the_file_that_was_there(tmp_path: Path, capsys, monkeypatch):
    """adv19b D2: outputs were written in place, so a write cut short (a full disk, Ctrl-C)
    left a cut file where a good one was; it is written beside and replaces it once whole."""
    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.arange(1, 9))
    out = tmp_path / "plan.json"
    assert main(["plan", str(lengths), "--dp", "2", "-o", str(out)]) == 0
    good = out.read_bytes()
    capsys.readouterr()

    def cut(self: Path, text: str, *args: object, **kwargs: object) -> None:
        with open(self, "w") as file:
            file.write(text[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Path, "write_text", cut)
        assert main(["plan", str(lengths), "--dp", "4", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "-o/--output" in err and "No space left" in err, err
    assert out.read_bytes() == good
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lengths.npy", "plan.json"]

    def interrupted(path: Path) -> None:
        path.write_bytes(b"{")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_output(out, "-o/--output", interrupted)
    assert out.read_bytes() == good
    assert sorted(path.name for path in tmp_path.iterdir()) == ["lengths.npy", "plan.json"]


def test_a_link_is_written_through_and_a_mode_kept(tmp_path: Path) -> None:
    target = tmp_path / "kept.npy"
    np.save(target, np.arange(3))
    target.chmod(0o640)
    if os.geteuid() == 0:  # a file root replaces for a user stays the user's
        os.chown(target, 12345, 12345)
    link = tmp_path / "link.npy"
    link.symlink_to(target.name)
    write_output(link, "-o/--output", lambda path: np.save(path, np.arange(5)))
    assert link.is_symlink() and np.load(target).tolist() == [0, 1, 2, 3, 4]
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    if os.geteuid() == 0:
        assert (target.stat().st_uid, target.stat().st_gid) == (12345, 12345)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kept.npy", "link.npy"]


def test_a_link_to_a_name_without_the_suffix_gets_the_whole_file(tmp_path: Path) -> None:
    """review19 item 2: the new file took the suffix of the link's target; np.save appends
    ".npy" to a name without it, so ``-o L.npy`` (a link to ``store/lengths_v1``) replaced the
    target with the empty new file and left the lengths in a hidden one."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "lengths_v1").write_bytes(b"old")
    link = tmp_path / "L.npy"
    link.symlink_to(store / "lengths_v1")
    write_output(link, "-o/--output", lambda path: np.save(path, np.arange(4)))
    assert np.load(link).tolist() == [0, 1, 2, 3]
    assert sorted(path.name for path in store.iterdir()) == ["lengths_v1"]


def test_a_file_no_rename_replaces_gets_the_whole_file_in_place(tmp_path: Path, monkeypatch):
    """review19 item 6: a bind-mounted output (``docker run -v plan.json:...``) refuses the
    rename (EBUSY): the write failed and the plan was lost; and a rename cut a file's other
    hard links off. The finished file is copied into such a target."""
    out = tmp_path / "plan.json"
    out.write_text("old")
    other = tmp_path / "linked.json"
    other.hardlink_to(out)
    write_output(out, "-o/--output", lambda path: path.write_text("new, linked"))
    assert other.read_text() == "new, linked"
    other.unlink()

    for refusal in (errno.EBUSY, errno.EPERM):  # a bind mount; another user's file in /tmp

        def refused(source: object, destination: object, code: int = refusal) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "replace", refused)
        write_output(out, "-o/--output", lambda path, c=refusal: path.write_text(f"new {c}"))
        assert out.read_text() == f"new {refusal}"
        assert sorted(path.name for path in tmp_path.iterdir()) == ["plan.json"]
