"""Writing files and folders so that no reader ever sees them half-written.

Everything countvae writes goes to a temporary name beside the destination and is renamed into place (``os.replace`` is
atomic on POSIX within one file system). An existing destination is an error unless ``overwrite=True``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from countvae._checks import check_bool
from countvae.errors import ModelFileError, OutputExistsError, OutputWriteError


def _refuse_existing(path: Path, overwrite: bool, a_file: bool = False) -> None:
    """Refuse an entry at ``path`` without ``overwrite``, a dangling symbolic link too.

    Where ``a_file`` is written, a folder is refused whatever ``overwrite`` says: a file is never renamed over a
    folder, which may hold the analyst's work.
    """
    check_bool("overwrite", overwrite)  # a truthy string such as "no" must not replace anything
    refuse_overlong_name(path)
    if a_file:
        refuse_folder_at_file(path)
    if os.path.lexists(path) and not overwrite:  # exists() follows a link: a dangling one would fail only at the end
        raise OutputExistsError(f"{path} {exists_as(path)}; pass overwrite=True (--overwrite) to replace it.")


def refuse_folder_at_file(path: Path) -> None:
    """Refuse a folder (not a link to one) at ``path``, where a file is written, whatever ``overwrite`` says."""
    if path.is_dir() and not path.is_symlink():
        raise OutputExistsError(
            f"{path} is a folder; a file is written there, and overwrite=True (--overwrite) replaces files only. "
            "Move or rename it, or write to another path."
        )


def exists_as(path: Path) -> str:
    """How messages say that the entry at ``path`` exists: ``"already exists"``, or where a dangling link leads.

    Through a chain of links, the missing path named is the last, which is missing; a link in a loop leads nowhere.
    """
    if path.is_symlink() and not path.exists():  # exists() is False for a link in a loop too
        target = _link_target(path)
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"is a symbolic link in a loop (through {target}), which leads to no file or folder"
        if os.path.islink(target):
            return f"is a symbolic link (through the link {target}) to the missing path {os.path.realpath(path)}"
        return f"is a symbolic link to the missing path {target}"
    return "already exists"


def _link_target(link: Path) -> str:
    """Where the symbolic link ``link`` points, a relative target joined to the link's folder (as ``link`` is given).

    A relative target is relative to the link's folder, not to the working folder, where the analyst would look.
    """
    return os.path.join(link.parent, os.readlink(link)) if link.parent != Path() else os.readlink(link)


@dataclass(frozen=True)
class FolderLayout:
    """What a writer puts in a folder it writes whole, so that ``overwrite`` replaces only such a folder.

    Parameters
    ----------
    what
        How messages name the folder (``"a model folder"``).
    files
        The names of the files it writes (any release's names, so that an older save is replaced too).
    folders
        The names of the folders it writes, each with its own layout.

    """

    what: str
    files: frozenset[str]
    folders: Mapping[str, FolderLayout] = field(default_factory=dict)

    def names(self) -> list[str]:
        """Its entries as messages list them: files, then folders with a trailing ``/``."""
        return sorted(self.files) + [f"{name}/" for name in sorted(self.folders)]


def foreign_entries(path: Path, layout: FolderLayout) -> list[str]:
    """The entries of the folder ``path`` (paths relative to it, sorted) that ``layout``'s writer does not write."""
    foreign = []
    for entry in sorted(path.iterdir()):
        if entry.name in layout.files and not entry.is_dir():
            continue
        if entry.name in layout.folders and entry.is_dir() and not entry.is_symlink():
            foreign += [f"{entry.name}/{name}" for name in foreign_entries(entry, layout.folders[entry.name])]
            continue
        foreign.append(f"{entry.name}/" if entry.is_dir() else entry.name)
    return foreign


def refuse_non_folder(path: str | os.PathLike) -> None:
    """Fail when something other than a folder is at ``path``, where a writer puts (or replaces) a folder whole.

    Refused whatever ``overwrite`` says: a file there may be data, and overwrite replaces folders only. A symbolic
    link is refused too, even to a folder: the folder is replaced by renames, which would replace the link, not
    what it points to (scvi-tools' ``save`` writes into the folder through a link; countvae never writes in place).

    Raises
    ------
    OutputExistsError
        If ``path`` is a file (or anything but a folder) or a symbolic link.
    OutputWriteError
        If a name in ``path`` is longer than the file system takes (:func:`refuse_overlong_name`).

    """
    path = Path(path)
    refuse_overlong_name(path)
    if path.is_symlink():
        raise OutputExistsError(
            f"{path} is a symbolic link (to {_link_target(path)}); countvae replaces a folder by renaming, which would "
            "replace the link, not the folder it points to. Write to that folder itself, or remove the link."
        )
    if path.exists() and not path.is_dir():
        raise OutputExistsError(
            f"{path} exists and is not a folder; a folder is written there, and overwrite=True (--overwrite) replaces "
            "folders only (a file may be data). Move or rename it, or write to another folder (another --out)."
        )


def refuse_foreign_entries(path: str | os.PathLike, overwrite: bool, layout: FolderLayout) -> None:
    """Fail when ``overwrite`` would replace the folder ``path`` although it holds what its writer did not write.

    A folder is replaced whole, so anything else in it (the analyst's data, notes) would be deleted; a file or link
    at ``path`` is refused with or without ``overwrite`` (:func:`refuse_non_folder`). Call it before any long work;
    :func:`atomic_directory` calls it again before writing.

    Raises
    ------
    InvalidArgumentError
        If ``overwrite`` is not a bool.
    OutputExistsError
        If ``path`` is not a folder (:func:`refuse_non_folder`), or ``overwrite`` is True and ``path`` is a folder
        holding an entry ``layout`` does not name.

    """
    check_bool("overwrite", overwrite)
    path = Path(path)
    refuse_non_folder(path)
    if not overwrite or not path.is_dir():
        return
    foreign = foreign_entries(path, layout)
    if foreign:
        shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
        raise OutputExistsError(
            f"{path} holds {shown}, which {layout.what} does not hold; overwrite=True (--overwrite) replaces the "
            f"folder whole and would delete them. Move them out of {path}, or write to another folder (another "
            f"--out). Only a folder holding nothing but {', '.join(layout.names())} is replaced."
        )


def _usual_permissions(path: str | os.PathLike, mode: int) -> None:
    """Give a temporary file (0600) or folder (0700) the permissions a plain ``open``/``mkdir`` would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: Errors of the file system (not of the caller) that a rerun can recover from once the cause is fixed.
_STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "an input/output error of the disk",
}


@contextlib.contextmanager
def explained_write_errors(path: Path, reused: bool = False) -> Iterator[None]:
    """Turn a file-system error raised in the block into an :class:`OutputWriteError` about ``path``.

    The message says what failed, that nothing was left half-written (the atomic writers remove their temporary files
    first) and what to do. Other errors pass unchanged. ``reused``: the writer resumes (``fit_seeds``, ``diagnose``,
    ``select``), so the message adds that a rerun reuses the finished results; an outer block's ``reused`` decides.
    """
    try:
        yield
    except OSError as exc:
        # An inner writer's error is told again about the outermost target: the path the caller asked for.
        cause = exc.__cause__ if isinstance(exc, OutputWriteError) else exc
        if exc.errno not in _STORAGE_ERRNOS or not isinstance(cause, OSError):
            raise
        error = OutputWriteError(
            f"Could not write {path}: {_STORAGE_ERRNOS[exc.errno]} ({errno.errorcode[exc.errno]}: "
            f"{os.strerror(exc.errno)}). Nothing was left half-written; what {path.parent} held before is intact. "
            f"Free disk space (or make {path.parent} writable, or choose another output folder) and rerun"
            + (": finished results are reused." if reused else ".")
        )
        error.errno = exc.errno
        error.filename = str(path)
        raise error from cause


def _reason(exc: BaseException) -> str:
    """Why an operation failed, as messages say it: ``Directory not empty (ENOTEMPTY)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def _other_os_errors_explained(path: Path) -> Iterator[None]:
    """Turn an OSError that :func:`explained_write_errors` passes on (not of the storage) into an OutputWriteError.

    For a writer's own steps (creating, renaming), where any such error means ``path`` could not be written there.
    """
    try:
        yield
    except OSError as exc:
        if isinstance(exc, OutputWriteError | OutputExistsError) or exc.errno in _STORAGE_ERRNOS:
            raise
        error = OutputWriteError(
            f"Could not write {path}: {_reason(exc)}. Nothing was left half-written; what {path} held before is "
            "intact. Choose another output folder."
        )
        error.errno = exc.errno
        error.filename = str(path)
        raise error from exc


#: What a temporary name adds to its target's name part, at most: the dots, the marker, mkstemp's random part and
#: ".partial", with room to spare.
_TEMPORARY_NAME_ROOM = 32

#: In every temporary name, after ``.<name>.``: no analyst writes it, so the clean-up of interrupted writes never takes
#: an analyst's entry for a leftover (a date such as ``.report.20261207.old`` looks like mkstemp's random part).
_MARKER = "countvae-"


def _name_max(folder: Path) -> int:
    """The longest file name (in bytes) that ``folder``'s file system takes; 255, the usual one, where it cannot say."""
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or a folder that does not exist
        return 255
    return limit if limit > _TEMPORARY_NAME_ROOM else 255


def refuse_overlong_name(path: str | os.PathLike) -> None:
    """Refuse, before any work, a name in ``path`` longer than the file system takes (the OS says only "too long").

    Raises
    ------
    OutputWriteError
        If a part of ``path`` (the last, or a folder to make) is longer, in bytes, than the file system allows.

    """
    path = Path(path)
    for part in (path, *path.parents):
        size, limit = len(os.fsencode(part.name)), _name_max(part.parent)
        if size > limit:
            error = OutputWriteError(
                f"Cannot write {path}: the name {part.name[:40]}... is {size} bytes long and the file system takes at "
                f"most {limit}. Choose a shorter name."
            )
            error.errno = errno.ENAMETOOLONG
            error.filename = str(path)
            raise error


def temporary_prefix(path: str | os.PathLike) -> str:
    """The prefix of the temporary names beside ``path`` (``.<name>.countvae-``), short enough for any legal ``path``.

    A temporary name is ``<prefix><random><suffix>``. Where one built from the whole name would be longer than the file
    system allows, the prefix keeps the name's start and a hash of all of it (``.<start>~<hash>.countvae-``): always
    the same for the same name, so that :func:`remove_interrupted_writes` finds what an interrupted write of it left.
    """
    path = Path(path)
    room = _name_max(path.parent) - _TEMPORARY_NAME_ROOM
    name = path.name
    if len(os.fsencode(name)) <= room:
        return f".{name}.{_MARKER}"
    digest = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
    start = name
    while start and len(os.fsencode(start + digest)) > room:  # whole characters, never half of a multi-byte one
        start = start[:-1]
    return f".{start}{digest}.{_MARKER}"


def refuse_file_in_the_way(folder: str | os.PathLike, remedy: str) -> None:
    """Fail, before any ``mkdir``, when ``folder`` or a folder above it exists and is not a folder, naming that entry.

    ``mkdir`` says only "Not a directory" (or "File exists") of ``folder``, never which entry is in the way. A
    symbolic link to a missing path is in the way too, and named as one.

    Raises
    ------
    OutputExistsError
        Naming the entry in the way, then ``remedy`` (``"choose another out_dir"``).

    """
    folder = Path(folder)
    if folder.is_dir():  # the usual case, in one system call
        return
    # lexists: a dangling link is in the way too (mkdir says "File exists" of it, a path that does not exist)
    in_the_way = next((p for p in (folder, *folder.parents) if os.path.lexists(p) and not p.is_dir()), None)
    if in_the_way is not None:
        where = "" if in_the_way == folder else f", so {folder} cannot be made"
        what = "exists and is not a folder" if in_the_way.exists() else exists_as(in_the_way)
        raise OutputExistsError(f"{in_the_way} {what}{where}; {remedy}.")


def check_writable(path: str | os.PathLike, reused: bool = False) -> None:
    """Fail now, before long work, when ``path``'s folder cannot be written (made if missing, and a file tried there).

    A writer that finds out only after hours of fitting loses them; ``reused`` is :func:`explained_write_errors`'s.
    """
    path = Path(path)
    refuse_overlong_name(path)
    refuse_file_in_the_way(path.parent, "choose another output folder")
    with explained_write_errors(path, reused=reused), _other_os_errors_explained(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass


def write_bytes_atomic(path: str | os.PathLike, data: bytes, overwrite: bool = False) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    Raises
    ------
    OutputExistsError
        If ``path`` exists and ``overwrite`` is False.
    OutputWriteError
        If the disk is full or the folder read-only (nothing is left half-written).

    """
    with atomic_file_path(path, overwrite) as tmp, os.fdopen(os.open(tmp, os.O_WRONLY), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = False) -> Path:
    """Write UTF-8 ``text`` atomically, see :func:`write_bytes_atomic`."""
    return write_bytes_atomic(path, text.encode("utf-8"), overwrite=overwrite)


def write_json_atomic(path: str | os.PathLike, obj: Any, overwrite: bool = False) -> Path:
    """Write ``obj`` as indented JSON atomically (NaN and infinities are refused)."""
    return write_text_atomic(path, json.dumps(obj, indent=2, allow_nan=False) + "\n", overwrite=overwrite)


@contextlib.contextmanager
def atomic_file_path(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for a writer that opens files itself (h5py, anndata).

    The temporary file is renamed to ``path`` when the block succeeds (:func:`place_file`: without ``overwrite``, a
    file put at ``path`` during the block is refused too, never replaced) and removed when it raises (a full disk or
    read-only folder becomes an :class:`OutputWriteError`). A folder at ``path`` is refused on entry whatever
    ``overwrite`` says, and one put there during the block at the end, the file kept beside it.
    """
    path = Path(path)
    _refuse_existing(path, overwrite, a_file=True)
    refuse_file_in_the_way(path.parent, "choose another output folder")
    with explained_write_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with pending_file(path) as tmp:
            yield tmp
            place_file(tmp, path, overwrite)
    _fsync_dir(path.parent)


@contextlib.contextmanager
def pending_file(path: Path) -> Iterator[Path]:
    """Yield an empty temporary file beside ``path`` (``.<name>.countvae-<random>.partial``), removed after the block.

    The random part keeps two runs writing ``path`` apart. A killed run leaves the file behind: where its caller
    owns the folder, :func:`remove_interrupted_writes` removes it; beside a path no lock covers (``diagnose``'s
    ``write_h5ad``), no run can tell it from another run's file being written, so none removes it
    (:func:`interrupted_writes` lists them).
    """
    fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(path), suffix=".partial", dir=path.parent)
    os.close(fd)
    try:
        _usual_permissions(tmp, 0o666)
        yield Path(tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):  # renamed into place, or kept
            os.unlink(tmp)


def place_file(tmp: Path, path: Path, overwrite: bool) -> None:
    """Rename the finished file ``tmp`` to ``path``; without ``overwrite``, never over an entry put there meanwhile.

    Another writer (a second run, the analyst) may have put a file at ``path`` since it was checked, hours ago
    perhaps (scvi-tools checks only before writing). A folder there is never replaced, even with ``overwrite``: it
    may hold the analyst's work, and ``overwrite`` replaces a file.

    Raises
    ------
    OutputExistsError
        If a folder is at ``path``, or ``overwrite`` is False and something is; ``tmp`` is kept as
        ``.<name>.countvae-<random>.kept``, which the message names (and the error's ``kept``).

    """
    if overwrite:
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            raise _changed_meanwhile(tmp, path, _put_there(path)) from None
        return
    try:
        os.link(tmp, path)  # unlike a rename, fails where path exists: no moment between the check and the rename
    except FileExistsError:
        raise _changed_meanwhile(tmp, path, _put_there(path)) from None
    except OSError:  # a file system without hard links: check, then rename
        if os.path.lexists(path):
            raise _changed_meanwhile(tmp, path, _put_there(path)) from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _put_there(path: Path) -> str:
    """What :func:`place_file` found at ``path``, as its refusal says it."""
    if path.is_symlink():
        return (
            f"another writer put a symbolic link there (to {_link_target(path)}), which is kept without "
            "overwrite=True (--overwrite)."
        )
    if path.is_dir():
        return "another writer put a folder there, which a file never replaces, with or without overwrite=True."
    return "another writer put a file there, which is kept without overwrite=True (--overwrite)."


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike, overwrite: bool = False, layout: FolderLayout | None = None
) -> Iterator[Path]:
    """Build a folder under a temporary name; rename it to ``path`` when the block succeeds.

    If the block raises, the temporary folder is removed and ``path`` is left as it was (a full disk or read-only
    folder becomes an :class:`OutputWriteError`). With ``overwrite=True`` an existing folder is replaced by two renames
    (old folder aside, new folder in, old folder deleted), so ``path`` is always either the complete old folder or the
    complete new one, except in the instant between the two renames, when it is absent; if the second rename fails,
    the old folder is moved back (where that fails, the error names where the old folder is). A file or a symbolic
    link at ``path`` is refused whatever ``overwrite`` says (:func:`refuse_non_folder`), and so is, given the writer's
    ``layout``, a folder holding anything that writer does not write (:func:`refuse_foreign_entries`).

    These checks are made on entry and again before the renames, since another writer (a second run with the same
    ``--out``) may put something at ``path`` during the block: without ``overwrite`` a folder put there meanwhile is
    refused too, never replaced (scvi-tools' ``save`` checks only before writing; here hours of work may pass
    meanwhile). Such a late refusal (:class:`OutputExistsError`) keeps the new folder as
    ``.<name>.countvae-<random>.kept`` beside ``path`` and names it.
    """
    path = Path(path)
    refuse_non_folder(path)
    _refuse_existing(path, overwrite)
    if layout is not None:
        refuse_foreign_entries(path, overwrite, layout)
    refuse_file_in_the_way(path.parent, "choose another output folder")
    with explained_write_errors(path):
        with _other_os_errors_explained(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=temporary_prefix(path), suffix=".partial", dir=path.parent))
        try:
            _usual_permissions(tmp, 0o777)
            yield tmp
            _fsync_dir(tmp)
            with _other_os_errors_explained(path):  # e.g. EBUSY: the working folder cannot be renamed
                _replace_folder(tmp, path, overwrite, layout)
            _fsync_dir(path.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _replace_folder(new: Path, path: Path, overwrite: bool, layout: FolderLayout | None) -> None:
    """Rename ``new`` to ``path``, after checking ``path`` again: another writer may have changed it during the block.

    What :func:`atomic_directory` refuses on entry is refused here too, and so is anything put at ``path`` as ``new``
    is renamed; a refusal keeps ``new`` under a name the error gives. With ``overwrite`` an existing folder is moved
    aside first, and back if the second rename fails.
    """
    try:
        refuse_non_folder(path)
        if path.exists() and not overwrite:
            raise OutputExistsError(
                "another writer put a folder there, which is kept without overwrite=True (--overwrite)."
            )
        if layout is not None:
            refuse_foreign_entries(path, overwrite, layout)
    except OutputExistsError as exc:
        raise _changed_meanwhile(new, path, str(exc)) from None
    aside = None
    if path.exists():
        aside = Path(tempfile.mkdtemp(prefix=temporary_prefix(path), suffix=".old", dir=path.parent))
        aside.rmdir()
        os.replace(path, aside)
    try:
        os.replace(new, path)  # a folder is never renamed over a file, a link or a folder with entries
    except BaseException as exc:
        if aside is None and isinstance(exc, OSError) and os.path.lexists(path):
            why = "another writer put something there as this run renamed its result into place."
            raise _changed_meanwhile(new, path, why) from None
        if aside is None:
            raise
        try:
            os.replace(aside, path)
        except OSError as back:  # e.g. another writer put a folder at path between the two renames
            raise OutputWriteError(
                f"Could not write {path}: {_reason(exc)}. The folder it held could not be moved back "
                f"({_reason(back)}): it is now {_kept(aside) or aside}; {_result_kept(_kept(new))}. Another "
                f"writer may have written {path} meanwhile; once none is at work, keep the folder you want and "
                "delete the others."
            ) from exc
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _changed_meanwhile(new: Path, path: Path, why: str) -> OutputExistsError:
    """The refusal of a final step that finds ``path`` changed during the block (``why``), ``new`` kept."""
    kept = _kept(new)
    error = OutputExistsError(
        f"Did not write {path}, which changed while this run was writing: {why} So that nothing is lost, "
        f"{_result_kept(kept)}; once no other writer is at work, decide which to keep at {path}."
    )
    error.kept = kept
    return error


def _result_kept(kept: Path | None) -> str:
    """Where the new folder or file an error gives up on is kept (:func:`_kept`, ``None``: not), as messages say it."""
    return f"this run's result is kept as {kept}" if kept else "this run's result could not be kept (renaming failed)"


def _kept(folder: Path) -> Path | None:
    """Rename a temporary ``folder`` (or file) that an error tells the user about to ``.<name>.countvae-<random>.kept``.

    :func:`remove_interrupted_writes` never removes that name, so a later run does not delete what the user was told
    to judge. ``None`` where the rename fails.
    """
    kept = folder.with_suffix(".kept")
    try:
        os.rename(folder, kept)
    except OSError:
        return None
    return kept


def interrupted_writes(folder: str | os.PathLike, name: str = "*") -> list[Path]:
    """The entries of ``folder`` that :func:`remove_interrupted_writes` would remove, sorted; nothing is removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    prefix = r"\..+\." + re.escape(_MARKER) if name == "*" else re.escape(temporary_prefix(folder / name))
    written = re.compile(prefix + r"[a-z0-9_]{8}\.(partial|old)")  # tempfile's random part: 8 of [a-z0-9_]
    return sorted(path for path in folder.iterdir() if written.fullmatch(path.name))


def remove_interrupted_writes(folder: str | os.PathLike, name: str = "*") -> list[Path]:
    """Remove what a writer killed mid-way left in ``folder`` under temporary names.

    The atomic writers above build ``.<name>.countvae-<random>.partial`` (and, while replacing,
    ``.<name>.countvae-<random>.old``) beside their target, ``<name>`` shortened where it is long
    (:func:`temporary_prefix`) and ``<random>`` the 8 characters of :mod:`tempfile`; a SIGKILL leaves them behind.
    Only names of exactly that form are removed, never another entry whose name merely starts alike (an analyst's
    ``.report.old`` or ``.report.20261207.old``), nor a folder an error named (``.<name>.countvae-<random>.kept``),
    and a link only as a link. Call this only where no other writer can be at work (the caller owns ``folder``).
    ``name`` limits the clean-up to one target's leftovers (``"*"``: any target's). Returns the paths removed.
    """
    removed = []
    for path in interrupted_writes(folder, name):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if not os.path.lexists(path):  # rmtree ignores errors: report only what is gone
            removed.append(path)
    return sorted(removed)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_versioned_json(path: str | os.PathLike, format_name: str, version: int, what: str) -> dict[str, Any]:
    """Read a JSON record that countvae wrote and check its ``format`` and ``format_version``.

    Parameters
    ----------
    path
        The JSON file.
    format_name, version
        What the record must declare in its ``format`` and ``format_version`` fields.
    what
        How to name the folder the record belongs to in errors (e.g. ``"a countvae model folder"``).

    Raises
    ------
    ModelFileError
        If the file is missing, not valid JSON (truncated or corrupted), or of another format or version.

    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(
            f"{path} is missing; {path.parent} is not {what}. Check the path, or restore the file from a copy."
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(
            f"{path} is not valid JSON (truncated or corrupted): {exc}. Restore {path.parent} from a copy, or "
            "write it again."
        ) from None
    if not isinstance(record, dict) or record.get("format") != format_name:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ModelFileError(
            f"{path} is not a {format_name} record (format {found!r}); {path.parent} is not {what}. Check the path."
        )
    if record.get("format_version") != version:
        raise ModelFileError(
            f"{path} has format version {record.get('format_version')!r}; this countvae reads version {version}. "
            "Read it with the countvae release that wrote it."
        )
    return record


#: The remedy of a damaged model file.
_RESTORE = "Restore the folder from a copy, or train and save the model again."


def load_checked_tensors(path: str | os.PathLike, expected_sha256: str | None) -> dict[str, Any]:
    """Load a dict of tensors saved with ``torch.save`` after checking its recorded SHA-256.

    Read with ``weights_only=True``, so a file holding anything but tensors (a pickle that would run code) is
    refused, never executed.

    Raises
    ------
    ModelFileError
        If the file is missing, its checksum is not the recorded one (truncated, altered or
        replaced), no checksum was recorded, or it does not hold a dict of tensors.

    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path} is missing. {_RESTORE}")
    if expected_sha256 is None:
        raise ModelFileError(f"No checksum is recorded for {path}; refusing to load it. {_RESTORE}")
    if sha256_file(path) != expected_sha256:
        raise ModelFileError(
            f"{path} does not match its recorded checksum (truncated, altered or replaced); refusing to load it. "
            f"{_RESTORE}"
        )
    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
        raise ModelFileError(
            f"{path} could not be read as tensors only, refusing to load it: {exc}. {_RESTORE}"
        ) from None
    if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise ModelFileError(f"{path} does not hold a dict of tensors. {_RESTORE}")
    return tensors
