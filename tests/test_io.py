"""Atomic writes (countvae/_io.py): temporary names beside the destination, and the clean-up of interrupted writes."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest

from countvae._io import (
    FolderLayout,
    atomic_directory,
    atomic_file_path,
    check_writable,
    refuse_foreign_entries,
    remove_interrupted_writes,
    temporary_prefix,
    write_bytes_atomic,
)
from countvae.errors import OutputExistsError, OutputWriteError

#: A legal file name (at most 255 bytes) too long to take the temporary names' additions (".<name>.<random>.partial").
LONG = "n" * 245 + ".h5ad"


def test_a_long_legal_name_is_written_through_every_writer(tmp_path):
    # The temporary name '.<name>.<random>.partial' of a 229- to 255-character name exceeded the file system's limit:
    # a raw "File name too long" after every fit (diagnose --write-h5ad), or after training (fit --out).
    assert len(LONG) == 250
    write_bytes_atomic(tmp_path / LONG, b"data")
    assert (tmp_path / LONG).read_bytes() == b"data"
    with atomic_file_path(tmp_path / LONG, overwrite=True) as tmp:
        assert len(tmp.name.encode()) <= 255
        tmp.write_bytes(b"new")
    assert (tmp_path / LONG).read_bytes() == b"new"
    folder = tmp_path / ("d" * 250)
    for overwrite, content in ((False, "first"), (True, "second")):  # the second moves the first aside
        with atomic_directory(folder, overwrite=overwrite) as tmp:
            (tmp / "f.txt").write_text(content)
        assert (folder / "f.txt").read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([LONG, folder.name])


def test_the_leftovers_of_an_interrupted_write_of_a_long_name_are_removed(tmp_path):
    leftovers = []
    for writer in (atomic_file_path, atomic_directory):
        with pytest.raises(KeyboardInterrupt), writer(tmp_path / LONG) as tmp:
            leftovers.append(tmp)
            raise KeyboardInterrupt
    leftovers[0].write_bytes(b"half")  # what a run killed mid-write (SIGKILL) leaves
    leftovers[1].mkdir()
    other = tmp_path / f"{temporary_prefix(tmp_path / ('m' * 250))}abcdefgh.partial"  # another target's
    other.write_bytes(b"")
    assert sorted(remove_interrupted_writes(tmp_path, LONG)) == sorted(leftovers)
    assert [p.name for p in tmp_path.iterdir()] == [other.name]
    assert remove_interrupted_writes(tmp_path) == [other]


def test_temporary_prefixes_keep_short_names_and_tell_long_ones_apart(tmp_path):
    assert temporary_prefix(tmp_path / "report") == ".report.countvae-"
    long_ones = {temporary_prefix(tmp_path / (stem * 250)) for stem in ("a", "b")}
    long_ones |= {temporary_prefix(tmp_path / ("é" * 127))}  # 254 bytes: cut on whole characters
    assert len(long_ones) == 3 and all(len(p.encode()) + 8 + len(".partial") <= 255 for p in long_ones)
    assert all(p.encode().decode() == p for p in long_ones)


@pytest.mark.parametrize("name", ["n" * 256, "é" * 128])  # 256 bytes: one too many, in ASCII and in UTF-8
def test_a_name_longer_than_the_file_system_takes_is_refused_before_any_work(tmp_path, name):
    # Such a name reached the OS: a raw 'File name too long' from Path.exists(), and diagnose --write-h5ad learnt
    # it only after every fit.
    target = tmp_path / "new" / name
    for attempt in (
        lambda: check_writable(target),
        lambda: write_bytes_atomic(target, b"data"),
        lambda: atomic_directory(target).__enter__(),
    ):
        with pytest.raises(OutputWriteError, match="is 256 bytes long and the file system takes at most 255"):
            attempt()
    assert list(tmp_path.iterdir()) == []  # nothing made, not even the missing folder


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_file_or_link_where_a_folder_goes_is_refused_whatever_overwrite_says(tmp_path, kind):
    # The check before any work let a file through with overwrite=True (diagnose then moved it aside and deleted it),
    # and a link to a folder was renamed aside and left behind, the new folder put in its place.
    real = tmp_path / "real"
    with atomic_directory(real) as tmp:
        (tmp / "report.md").write_text("old")
    path = tmp_path / "report"
    if kind == "file":
        path.write_text("my notes")
    else:
        path.symlink_to(real)
    refused = "exists and is not a folder" if kind == "file" else f"is a symbolic link \\(to {real}\\)"
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=refused):
            refuse_foreign_entries(path, overwrite, FolderLayout("a report folder", frozenset({"report.md"})))
        with pytest.raises(OutputExistsError, match=refused), atomic_directory(path, overwrite=overwrite) as tmp:
            (tmp / "report.md").write_text("new")
    assert (real / "report.md").read_text() == "old"
    assert path.is_symlink() if kind == "link" else path.read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real", "report"]


def test_the_clean_up_removes_only_the_names_an_interrupted_writer_leaves(tmp_path):
    # Every name starting '.report.' and ending '.partial' or '.old' was deleted, an analyst's '.report.old' too;
    # then any 8 characters between them, so an analyst's date-stamped '.report.20261207.old'.
    kept = [".report.old", ".report.backup-2024.old", ".report.20261207.old", ".report.html.partial"]
    kept += [".report.notes.partial", ".report.countvae-k3j4h5g6.kept"]  # the last: a folder an error named
    for name in kept[:-2]:
        (tmp_path / name).mkdir()
    (tmp_path / kept[-2]).write_text("mine")
    (tmp_path / kept[-1]).mkdir()
    left = [tmp_path / ".report.countvae-k3j4h5g6.partial", tmp_path / ".report.countvae-k3j4_5g6.old"]
    for path in left:
        path.mkdir()
    assert remove_interrupted_writes(tmp_path, "report") == sorted(left)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_the_clean_up_reports_only_what_it_removed(tmp_path, monkeypatch):
    # A leftover link to a folder was passed to rmtree, which failed without a word, and reported as removed.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / ".report.countvae-abcd1234.old"
    link.symlink_to(elsewhere)
    assert remove_interrupted_writes(tmp_path, "report") == [link]
    assert [p.name for p in tmp_path.iterdir()] == ["elsewhere"]  # the link removed, not what it points to
    left = tmp_path / ".report.countvae-abcd1234.partial"
    left.mkdir()
    monkeypatch.setattr(shutil, "rmtree", lambda *args, **kwargs: None)  # a folder that could not be removed
    assert remove_interrupted_writes(tmp_path, "report") == [] and left.is_dir()


def test_an_old_folder_that_cannot_be_moved_back_is_named(tmp_path, monkeypatch):
    # Two saves at once: the other put its folder in place between this one's two renames, and the error said that
    # what the path held before was intact, while it sat in a hidden '.<name>.<random>.old' nothing removes.
    target = tmp_path / "model"
    with atomic_directory(target) as tmp:
        (tmp / "f").write_text("old")
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == target and Path(src).name.endswith(".partial"):
            (target / "theirs").mkdir(parents=True)  # the other writer's folder, renamed in meanwhile
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OutputWriteError) as info, atomic_directory(target, overwrite=True) as tmp:
        (tmp / "f").write_text("new")
    kept = {(p / "f").read_text(): p for p in tmp_path.glob(".model.*")}
    assert sorted(kept) == ["new", "old"] and (target / "theirs").is_dir()
    message = str(info.value)
    assert f"it is now {kept['old']};" in message and f"result is kept as {kept['new']}." in message
    assert "intact" not in message
    # the folder the user was told to judge was deleted by the next run's clean-up
    assert remove_interrupted_writes(tmp_path, "model") == [] and remove_interrupted_writes(tmp_path) == []
    assert all(folder.is_dir() for folder in kept.values())


def _put_meanwhile(target: Path, what: str) -> None:
    """What another writer puts at ``target`` while a writer of it is at work."""
    if what == "file":
        shutil.rmtree(target, ignore_errors=True)
        target.write_text("the analyst's data")
    elif what == "notes":
        (target / "notes.txt").write_text("notes")
    else:
        (target / "theirs").mkdir(parents=True)


@pytest.mark.parametrize(
    ("before", "overwrite", "what", "refused"),
    [
        (False, False, "folder", r"another writer put a folder there, which is kept without overwrite=True"),
        (True, True, "file", "exists and is not a folder"),
        (True, True, "notes", "holds notes.txt, which a report folder does not hold"),
    ],
)
def test_what_another_writer_puts_at_the_path_meanwhile_is_refused_and_the_result_kept(
    tmp_path, before, overwrite, what, refused
):
    # The checks ran only on entry: the swap moved aside and deleted another run's folder though overwrite=False
    # (two 'countvae fit --out X' both ended well, one output lost), and hid a file put there as a '.old' folder.
    target = tmp_path / "report"
    if before:
        with atomic_directory(target) as tmp:
            (tmp / "report.md").write_text("old")
    layout = FolderLayout("a report folder", frozenset({"report.md"}))
    with pytest.raises(OutputExistsError) as info, atomic_directory(target, overwrite, layout) as tmp:
        (tmp / "report.md").write_text("mine")
        _put_meanwhile(target, what)
    (kept,) = tmp_path.glob(".report.*")
    message = str(info.value)
    assert message.startswith(f"Did not write {target}, which changed while this run was writing: ")
    assert refused in message and f"this run's result is kept as {kept};" in message
    assert kept.name.endswith(".kept") and (kept / "report.md").read_text() == "mine"
    assert target.is_file() if what == "file" else (target / ("notes.txt" if before else "theirs")).exists()
    assert remove_interrupted_writes(tmp_path) == [] and kept.is_dir()


def test_a_folder_put_at_the_path_as_the_result_is_renamed_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "model"
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == target and Path(src).name.endswith(".partial"):
            _put_meanwhile(target, "folder")  # after the last check, before the rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match="put something there as this run renamed"):
            with atomic_directory(target, overwrite=overwrite) as tmp:
                (tmp / "f").write_text("mine")
        shutil.rmtree(target)
    assert [(p / "f").read_text() for p in tmp_path.glob(".model.countvae-*.kept")] == ["mine", "mine"]


@pytest.mark.parametrize("links", [True, False])
def test_a_file_put_at_a_file_writers_path_meanwhile_is_refused_and_the_result_kept(tmp_path, monkeypatch, links):
    # atomic_file_path checked the path only on entry: without overwrite, it replaced a file another writer put there
    # during the block, and no error was raised. links=False: a file system without hard links.
    if not links:

        def no_link(src, dst):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        monkeypatch.setattr(os, "link", no_link)
    target = tmp_path / "result.json"
    with pytest.raises(OutputExistsError) as info, atomic_file_path(target) as tmp:
        tmp.write_text("mine")
        target.write_text("theirs")
    assert re.fullmatch(r"\.result\.json\.countvae-[a-z0-9_]{8}\.partial", tmp.name)  # what the clean-up removes
    (kept,) = tmp_path.glob(".result.json.*")
    message = str(info.value)
    assert message.startswith(f"Did not write {target}, which changed while this run was writing: another writer")
    assert f"this run's result is kept as {kept};" in message and kept.name.endswith(".kept")
    assert target.read_text() == "theirs" and kept.read_text() == "mine"
    assert remove_interrupted_writes(tmp_path) == [] and kept.is_file()
    with atomic_file_path(target, overwrite=True) as tmp:  # with overwrite, replaced as before
        tmp.write_text("mine")
    assert target.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == [kept.name, target.name]


def test_a_file_above_a_folder_to_make_is_named(tmp_path):
    # check_writable said "File exists (EEXIST)" of a path that did not exist, not naming the file in the way
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(OutputExistsError, match=f"^{tmp_path / 'afile'} exists and is not a folder, so "):
        check_writable(tmp_path / "afile" / "sub" / "out")


def test_a_dangling_link_in_the_way_is_named_before_any_mkdir(tmp_path):
    # exists() follows a link: a link to a missing path passed, and mkdir said "File exists (EEXIST)" of a path that
    # does not exist (check_writable, atomic_directory as report.save writes, atomic_file_path)
    link = tmp_path / "dl"
    link.symlink_to(tmp_path / "gone")
    refused = f"^{link} is a symbolic link to the missing path {tmp_path / 'gone'}, so {link / 'sub'} cannot be made"
    for write in (
        lambda: check_writable(link / "sub" / "out.h5ad"),
        lambda: atomic_directory(link / "sub" / "report").__enter__(),
        lambda: atomic_file_path(link / "sub" / "a.json").__enter__(),
    ):
        with pytest.raises(OutputExistsError, match=refused):
            write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dl"]


def test_a_link_that_leads_nowhere_names_where_it_leads(tmp_path, monkeypatch):
    # The first hop was named "the missing path" though it existed (a link in a chain, or in a loop), and a relative
    # target was shown bare, relative to the link's folder where the analyst reads it relative to the working folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    links = {"chain": "chain2", "chain2": "gone", "loop1": "loop2", "loop2": "loop1", "sub/rel": "gone"}
    for link, target in links.items():
        (tmp_path / link).symlink_to(target)
    said = {
        "chain": f"chain is a symbolic link (through the link chain2) to the missing path {tmp_path / 'gone'}; ",
        "loop1": "loop1 is a symbolic link in a loop (through loop2), which leads to no file or folder; ",
        "sub/rel": "sub/rel is a symbolic link to the missing path sub/gone; ",
    }
    for link, message in said.items():
        with pytest.raises(OutputExistsError, match=f"^{re.escape(message)}pass overwrite"):
            atomic_file_path(Path(link)).__enter__()


def test_a_dangling_link_at_a_file_to_write_is_refused_on_entry(tmp_path):
    # refused only by the final rename, after the block's work, as "another writer put a file there"
    link = tmp_path / "a.json"
    link.symlink_to(tmp_path / "nowhere.json")
    with pytest.raises(OutputExistsError, match=f"^{link} is a symbolic link to the missing path .*; pass overwrite"):
        with atomic_file_path(link):
            raise AssertionError("entered the block")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"] and link.is_symlink()


def test_a_folder_at_a_file_to_write_is_refused_on_entry_with_overwrite(tmp_path):
    # with overwrite, the block ran and the final rename was refused as "changed while this run was writing"
    folder = tmp_path / "c.json"
    folder.mkdir()
    with pytest.raises(OutputExistsError, match=f"^{folder} is a folder; a file is written there, and overwrite"):
        write_bytes_atomic(folder, b"{}", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"] and folder.is_dir()
