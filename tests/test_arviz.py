"""countvae's one arviz module (countvae/_arviz.py) in environments that arviz's import does not expect."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_countvae_imports_and_runs_with_an_unwritable_cache_folder(tmp_path):
    # arviz 0.23 writes a daily stamp into the user's cache folder at import: with HOME and XDG_CACHE_HOME unwritable
    # (a service account, a read-only container) `import countvae` and every command ended in a PermissionError.
    # The tests run as root, for whom no folder is read-only: a path under a regular file cannot be created either.
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = dict(
        os.environ,
        HOME=str(blocker / "home"),
        XDG_CACHE_HOME=str(blocker / "cache"),
        MPLCONFIGDIR=str(tmp_path / "matplotlib"),
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    script = "import os, countvae, countvae._arviz; print(os.environ['XDG_CACHE_HOME'])"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{blocker / 'cache'}\n", "the user's XDG_CACHE_HOME is restored after the import"
    proc = subprocess.run(
        [sys.executable, "-m", "countvae", "--version"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0 and proc.stdout.startswith("countvae "), proc.stderr
    assert "Traceback" not in proc.stderr
