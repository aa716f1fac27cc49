"""The command line's glibc malloc settings: they take effect, and only the command line applies them."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

import countvae.cli as cli
from countvae import _allocator

# Minor page faults of a loop that allocates and frees a 16 MiB tensor, before and after the settings.
_FAULTS = """
import resource, sys, torch
import countvae.cli  # importing the package and its command line must not change the allocator
from countvae._allocator import keep_freed_memory

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        a = torch.ones(2**22)
        b = a * 2.0
        del a, b
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults()  # warm-up: glibc's dynamic threshold settles
default = faults()
applied = keep_freed_memory()
faults()
print(default, faults(), applied)
"""


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    return sys.platform.startswith("linux")


@pytest.mark.skipif(not _glibc(), reason="glibc only: other C libraries have other allocators")
def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    env = {k: v for k, v in os.environ.items() if k not in _allocator.ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True)
    default, tuned, applied = out.stdout.split()
    assert applied == "True"
    # by default (also after importing countvae.cli) each 16 MiB block is fresh zeroed pages (4,096 faults
    # each); kept, it is reused
    assert int(default) > 40 * 4096
    assert int(tuned) < int(default) / 20


def test_a_users_environment_setting_is_respected(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert _allocator.keep_freed_memory() is False


def test_the_command_line_applies_it(monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: calls.append(1) or True)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls == [1]
