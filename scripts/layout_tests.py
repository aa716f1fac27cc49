"""Lay the tests out like the package: move ``tests/test_*.py`` into the folder of what each one tests.

Run from the repository root: ``python scripts/layout_tests.py`` (``--dry-run`` only prints). It

1. moves (``git mv``) every test file named in :data:`LAYOUT` that is still in ``tests/`` to its folder;
2. in each moved file, rewrites ``Path(__file__).resolve().parent`` paths so that they name the same folders
   (the repository root, ``tests/``) from the new depth;
3. rewrites ``tests/test_NAME.py`` references in the repository's text files (docs, benchmarks, tutorials,
   tests) to the new paths.

It can be run again on a tree that has new test files: it lists the ``tests/test_*.py`` files that
:data:`LAYOUT` does not place, to be added to it. Helper modules (``conftest.py``, ``ties.py``, ...) stay in
``tests/``: ``tests/conftest.py`` puts ``tests/`` on ``sys.path`` for every test (pytest's default
``prepend`` import mode), so ``from ties import ...`` works from any folder below it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: Folder under tests/ of each test file ("" for tests of the whole package or of its top-level modules).
LAYOUT: dict[str, list[str]] = {
    "": [
        "test_architecture",
        "test_conventions",
        "test_docs",
        "test_error_remedies",
        "test_function_length",
        "test_fuzz_inputs",
        "test_ica",
        "test_ica_model",
        "test_metrics",
        "test_plotting",
        "test_properties",
        "test_report_files",
        "test_security",
        "test_settings",
        "test_soak",
        "test_wheel",
    ],
    "data": ["test_backed", "test_data_layouts", "test_gene_selection", "test_validation"],
    "module": ["test_distributions", "test_importance", "test_marginal", "test_module"],
    "model": [
        "test_anndata_results",
        "test_differential",
        "test_lpd",
        "test_lpd_default",
        "test_model",
        "test_query_cells",
        "test_restricted_models",
        "test_stopping",
    ],
    "invariance": [
        "test_grid_quadrature",
        "test_invariance_elbo",
        "test_invariance_transforms",
        "test_reparameterize",
        "test_verify",
    ],
    "diagnostics": ["test_diagnose_library"],
    "diagnostics/fitting": [
        "test_fault_broken",
        "test_fault_disk",
        "test_fault_lock",
        "test_fault_workers",
        "test_fitting",
        "test_fitting_backed",
        "test_fitting_parallel",
        "test_resume",
        "test_scvi_adapter",
        "test_scvi_lpd",
    ],
    "diagnostics/analyses": [
        "test_knn_analyst_graph",
        "test_seed_groups",
        "test_alignment",
        "test_downstream",
        "test_ground_truth",
        "test_ica_components",
        "test_invariants",
        "test_markers",
        "test_ppc",
        "test_predictive",
        "test_resampling",
        "test_rhat",
        "test_subspace",
    ],
    "diagnostics/reporting": [
        "test_calibration_regimes",
        "test_compare_restrictions",
        "test_downstream_section",
        "test_headline_consistency",
        "test_headline_wording",
        "test_model_comparison",
        "test_report",
        "test_report_anndata",
        "test_report_lpd_jobs",
        "test_report_render",
        "test_report_schema",
        "test_report_sections",
        "test_restrictions_known_truth",
        "test_restrictions_section",
        "test_verdict_calibration",
        "test_verdicts",
    ],
    "cli": [
        "test_allocator",
        "test_cli",
        "test_cli_diagnose",
        "test_cli_diagnose_restrictions",
        "test_cli_select",
        "test_cli_settings",
        "test_cli_verify_invariance",
        "test_first_contact",
    ],
    "tutorials": ["test_notebook_outputs", "test_tutorials"],
    "benchmarks": [
        "test_bench_report",
        "test_bench_restrictions",
        "test_benchmarks",
        "test_bilipschitz",
        "test_calibration",
        "test_calibration_regimes_driver",
        "test_ica_benchmarks",
        "test_lpd_package_bench",
        "test_lpd_prototype",
    ],
}

#: Text files whose ``tests/test_NAME.py`` references are rewritten.
TEXT_SUFFIXES = (".py", ".md", ".ipynb", ".toml", ".sh", ".cfg", ".txt", ".rst")
#: ``Path(__file__).resolve()`` followed by ``.parent`` once or more.
PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)((?:\.parent)+)")


def folder_of() -> dict[str, str]:
    """Each test module's folder under tests/, by module name."""
    placed: dict[str, str] = {}
    for folder, names in LAYOUT.items():
        for name in names:
            if name in placed:
                raise SystemExit(f"{name} is placed twice in LAYOUT ({placed[name]!r} and {folder!r}).")
            placed[name] = folder
    return placed


def new_path(name: str, folder: str) -> str:
    """``tests/<folder>/<name>.py`` as a posix path relative to the root."""
    return "/".join(part for part in ("tests", folder, f"{name}.py") if part)


def deepen(text: str, depth: int) -> str:
    """``Path(__file__).resolve().parent...`` of a file moved ``depth`` folders down, naming the same folder."""

    def replace(match: re.Match) -> str:
        levels = match.group(1).count(".parent") + depth
        return f"Path(__file__).resolve().parents[{levels - 1}]"

    return PARENTS.sub(replace, text) if depth else text


def tracked_text_files() -> list[Path]:
    """The files git tracks (plus untracked, not ignored ones) with a text suffix."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / p for p in listed if p.endswith(TEXT_SUFFIXES) and (ROOT / p).is_file()]


def rewrite_references(placed: dict[str, str], dry_run: bool) -> list[str]:
    """Rewrite ``tests/test_NAME.py`` (and the glob ``tests/test_fault_*``) to the new paths; the files changed."""
    moved = {name: folder for name, folder in placed.items() if folder}
    pattern = re.compile(r"(?<![\w/])tests/(test_\w+)\.py\b")
    fault_folders = {folder for name, folder in moved.items() if name.startswith("test_fault_")}
    fault_glob = f"tests/{fault_folders.pop()}/test_fault_*" if len(fault_folders) == 1 else None
    changed = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        new = pattern.sub(lambda m: new_path(m[1], moved[m[1]]) if m[1] in moved else m[0], text)
        if fault_glob is not None:
            new = new.replace("tests/test_fault_*", fault_glob)
        if new != text:
            changed.append(str(path.relative_to(ROOT)))
            if not dry_run:
                path.write_text(new, encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    """Move the tests, fix their paths and the references to them; print what was done."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    args = parser.parse_args(argv)
    placed = folder_of()
    unplaced = sorted(p.stem for p in TESTS.glob("test_*.py") if p.stem not in placed)
    for name, folder in sorted(placed.items()):
        old = TESTS / f"{name}.py"
        if not folder or not old.exists():
            continue
        target = ROOT / new_path(name, folder)
        print(f"{old.relative_to(ROOT)} -> {target.relative_to(ROOT)}")
        if args.dry_run:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(old), str(target)], cwd=ROOT, check=True)
        target.write_text(deepen(target.read_text(encoding="utf-8"), folder.count("/") + 1), encoding="utf-8")
    for path in rewrite_references(placed, args.dry_run):
        print(f"references rewritten: {path}")
    if unplaced:
        print(f"not placed (add them to LAYOUT): {', '.join(unplaced)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
