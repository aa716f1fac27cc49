"""The command line's glibc malloc settings: they take effect, and only the command line applies them."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

import countvae.cli as cli
from countvae import _allocator

# A loop that allocates and frees three 16 MiB tensors, first under glibc's documented static defaults
# (mmap and trim thresholds of 128 KiB), then with the settings. Left to itself glibc moves its thresholds
# at run time, and whether this small loop then trims its heap depends on the heap's layout at the time
# (seen both ways in repeated runs), so the baseline pins the static defaults. Two observables: the minor
# page faults of the loop (what the settings are for), and glibc's own count of free bytes it keeps in
# the main heap afterwards (mallinfo2; the mechanism). Some kernels do not count page faults (getrusage
# reports 0): the control, touching a fresh 16 MiB mapping, tells whether they are counted.
_FAULTS = """
import ctypes, mmap, resource, torch
import countvae.cli  # importing the package and its command line must not change the allocator
from countvae._allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3

def minflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def control():
    before = minflt()
    mapping = mmap.mmap(-1, 2**24)
    for offset in range(0, 2**24, 4096):
        mapping[offset] = 1
    mapping.close()
    return minflt() - before

def loop():
    before = minflt()
    for _ in range(40):
        a = torch.ones(2**22)
        b = a * 2.0
        c = b * 2.0
        del a, b, c
    return minflt() - before, libc.mallinfo2().fordblks

assert libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024) == libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024) == 1
loop()
default_faults, default_free = loop()
applied = keep_freed_memory()
loop()
tuned_faults, tuned_free = loop()
print(control(), default_faults, default_free, tuned_faults, tuned_free, applied)
"""


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux")


@pytest.mark.skipif(not _glibc(), reason="glibc only: other C libraries have other allocators")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    env = {k: v for k, v in os.environ.items() if k not in (*_allocator.ENVIRONMENT, "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True)
    control, default_faults, default_free, tuned_faults, tuned_free, applied = out.stdout.split()
    assert applied == "True"
    block = 2**24
    # under the defaults (also after importing countvae.cli) glibc gives the freed blocks back to the
    # kernel; with the settings all three stay in the heap for the next iteration
    assert int(default_free) < block
    assert int(tuned_free) >= 3 * block
    if int(control) < block // 4096 // 2:
        return  # this kernel does not count minor page faults: the fault counts below would be 0 either way
    # each fresh 16 MiB block is 4,096 zero-filled pages; kept, it is reused without faults
    assert int(default_faults) >= 3 * 40 * block // 4096
    assert int(tuned_faults) < int(default_faults) / 20


@pytest.mark.parametrize(
    ("name", "value"),
    [("MALLOC_TRIM_THRESHOLD_", "131072"), ("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=0:glibc.malloc.trim_threshold=1")],
)
def test_a_users_environment_setting_is_respected(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert _allocator.keep_freed_memory() is False


def test_unrelated_tunables_do_not_stop_it(monkeypatch):
    for name in _allocator.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_shstk=0")
    assert _allocator._user_tuned_malloc() is False


def test_the_command_line_applies_it(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(1) or True)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls == [1]
