"""Loading a model never runs code from its files."""

from __future__ import annotations

import json
import os
import pickle

import pytest

import countvae as cv
from countvae._io import sha256_file
from countvae.errors import ModelFileError


class _Exploit:
    """Unpickling this object would run a shell command that creates a marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_malicious_pickle_is_refused_without_running(trained_linear, tmp_path):
    folder = tmp_path / "model"
    trained_linear.save(folder)
    marker = tmp_path / "pwned"
    params = folder / "params.pt"
    with open(params, "wb") as fh:
        pickle.dump({"module.decoder.weight": _Exploit(str(marker))}, fh)
    # an attacker controls the whole folder, so make the checksum match the planted file
    record = json.loads((folder / "model.json").read_text())
    record["checksums"]["params.pt"] = sha256_file(params)
    (folder / "model.json").write_text(json.dumps(record))
    # the payload is real: plain pickle.load would run it
    with pytest.raises(ModelFileError, match="tensors only"):
        cv.CountVAE.load(folder)
    assert not marker.exists()
    with open(params, "rb") as fh:
        pickle.load(fh)
    assert marker.exists()


def test_settings_are_json_not_pickle(trained_linear, tmp_path):
    trained_linear.save(tmp_path / "m")
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == ["model.json", "params.pt"]
    record = json.loads((tmp_path / "m" / "model.json").read_text())
    assert record["format"] == "countvae-model" and record["format_version"] == 1
    assert {"torch", "pyro-ppl", "numpy"} <= set(record["versions"])


def test_incompatible_format_version(trained_linear, tmp_path):
    folder = tmp_path / "m"
    trained_linear.save(folder)
    record = json.loads((folder / "model.json").read_text())
    record["format_version"] = 99
    (folder / "model.json").write_text(json.dumps(record))
    with pytest.raises(ModelFileError, match="format version 99"):
        cv.CountVAE.load(folder)
    (folder / "model.json").write_text("{ truncated")
    with pytest.raises(ModelFileError, match="model.json is not valid JSON"):
        cv.CountVAE.load(folder)


def test_save_is_atomic_when_interrupted(trained_linear, tmp_path, monkeypatch):
    import countvae.model.persistence as persistence

    def failing_write(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(persistence, "write_json_atomic", failing_write)
    with pytest.raises(OSError, match="disk full"):
        trained_linear.save(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one is left


def test_save_on_a_full_disk_is_one_write_error_and_leaves_nothing(trained_linear, tmp_path, monkeypatch):
    # torch.save wrote params.pt itself, and a full disk raised torch's RuntimeError ("unexpected pos"), not an
    # OutputWriteError; the remedy also said "finished results are reused", which a save does not do
    import errno

    from countvae.errors import OutputWriteError

    real_fdopen = os.fdopen

    class _Full:
        def __init__(self, fh):
            self.fh = fh

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

    def fdopen(fd, *args, **kwargs):
        fh = real_fdopen(fd, *args, **kwargs)
        return _Full(fh) if "params.pt" in os.readlink(f"/proc/self/fd/{fd}") else fh

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(OutputWriteError) as info:
        trained_linear.save(tmp_path / "m")
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert message.startswith(f"Could not write {tmp_path / 'm'}: the disk is full (ENOSPC")
    assert message.endswith("or choose another output folder) and rerun.")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor a temporary one is left


def test_written_files_get_the_usual_permissions(trained_linear, tmp_path):
    import stat

    umask = os.umask(0o022)
    try:
        trained_linear.save(tmp_path / "m")
    finally:
        os.umask(umask)
    folder = tmp_path / "m"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    for name in ("model.json", "params.pt"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o644
