"""A full disk or a read-only output folder while a seed is saved: nothing half-written, nothing lost, a rerun recovers.

The fault is injected where the operating system would report it: ``os.fdopen``
hands back a file whose ``write`` stores half the bytes and then fails with
ENOSPC, or ``os.replace`` fails with EROFS when the seed folder is renamed into
place. Both only for seed 2's files, after seeds 0 and 1 were stored by an
earlier run.
"""

from __future__ import annotations

import errno
import os

import pytest
from faults_helpers import assert_same_numbers, files_of, leftovers, numbers, run, tiny_data

from countvae.errors import OutputWriteError


class _FillsUp:
    """A binary file that takes half of what it is given, then reports a full disk."""

    def __init__(self, fh):
        self._fh = fh

    def write(self, data: bytes) -> int:
        self._fh.write(data[: len(data) // 2])
        self._fh.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()


def _disk_fills_while_writing(monkeypatch, target: str) -> None:
    real_fdopen = os.fdopen

    def fdopen(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        return _FillsUp(fh) if target in os.readlink(f"/proc/self/fd/{fd}") else fh

    monkeypatch.setattr(os, "fdopen", fdopen)


def _read_only_at_rename(monkeypatch, target: str) -> None:
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if os.fspath(dst).endswith(target):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize(
    ("inject", "errno_", "said"),
    [(_disk_fills_while_writing, errno.ENOSPC, "the disk is full"), (_read_only_at_rename, errno.EROFS, "read-only")],
    ids=["ENOSPC-mid-write", "EROFS-at-rename"],
)
def test_full_or_read_only_disk_mid_save_loses_nothing(tmp_path, monkeypatch, inject, errno_, said):
    adata = tiny_data()
    out = tmp_path / "out"
    run(adata, out, seeds=[0, 1])
    before = {s: files_of(out / "fits" / f"seed_{s}") for s in (0, 1)}

    with monkeypatch.context() as patch:
        inject(patch, "seed_2")
        with pytest.raises(OutputWriteError) as info:
            run(adata, out)
    message = str(info.value)
    assert info.value.errno == errno_ and said in message
    assert "seed_2" in message and "Nothing was left half-written" in message
    assert message.endswith("and rerun: finished results are reused.")  # as the rerun below does
    assert leftovers(out) == [], "a temporary file or folder was left behind"
    assert not (out / "fits" / "seed_2").exists()
    assert {s: files_of(out / "fits" / f"seed_{s}") for s in (0, 1)} == before, "a stored seed changed"

    fits = run(adata, out)
    assert fits.reused_seeds == [0, 1]
    assert_same_numbers(fits, numbers(run(adata, None)))
