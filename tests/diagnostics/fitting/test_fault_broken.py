"""Damaged saved state: each damage is named (seed folder, file) with its remedy; refit_broken repairs only it.

After a complete run of seeds 0, 1 and 2, seed 1's folder (or seeds 1 and 2's) is
damaged on disk the ways files get damaged: cut short, emptied, removed, or
swapped with another seed's. A rerun must refuse, naming the folder, the file and
``refit_broken=True``; a rerun with it must move the damaged folders aside
(their bytes kept), refit those seeds alone and give exactly the numbers of an
uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from faults_helpers import assert_same_numbers, files_of, numbers, run, tiny_data

from countvae.errors import BrokenFitError, ModelFileError, OutputExistsError


@pytest.fixture(scope="module")
def adata():
    return tiny_data()


@pytest.fixture(scope="module")
def reference(adata):
    return numbers(run(adata, None))


@pytest.fixture(scope="module")
def complete(adata, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("complete") / "out"
    run(adata, out)
    return out


def _copy(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


FITS = Path("fits")
DAMAGES = {
    "params truncated": (lambda f: _truncate(f / "seed_1/model/params.pt"), [1], "seed_1/model/params.pt"),
    "params zero-length": (lambda f: (f / "seed_1/model/params.pt").write_bytes(b""), [1], "seed_1/model/params.pt"),
    "settings truncated": (lambda f: _truncate(f / "seed_1/model/model.json"), [1], "seed_1/model/model.json"),
    "fit record zero-length": (lambda f: (f / "seed_1/fit.json").write_bytes(b""), [1], "seed_1/fit.json"),
    "fit record missing": (lambda f: (f / "seed_1/fit.json").unlink(), [1], "seed_1/fit.json"),
    "params swapped between seeds": (
        lambda f: _swap(f / "seed_1/model/params.pt", f / "seed_2/model/params.pt"),
        [1, 2],
        "seed_1/model/params.pt",
    ),
    "model folders swapped between seeds": (
        lambda f: _swap(f / "seed_1/model", f / "seed_2/model"),
        [1, 2],
        "seed_1/model/",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_seed_folder_is_named_then_refit_alone(damage, adata, reference, complete, tmp_path, caplog):
    out = tmp_path / "out"
    _copy(complete, out)
    fits_dir = out / "fits"
    harm, damaged, named = DAMAGES[damage]
    harm(fits_dir)
    damaged_bytes = {s: files_of(fits_dir / f"seed_{s}") for s in damaged}
    intact = {s: files_of(fits_dir / f"seed_{s}") for s in (0, 1, 2) if s not in damaged}

    with pytest.raises(BrokenFitError) as info:
        run(adata, out)
    message = str(info.value)
    assert str(fits_dir / named) in message, f"the damaged file is not named: {message}"
    assert "refit_broken=True" in message and "--refit-broken" in message and "remove" in message
    assert all(f"seed {s}" in message for s in damaged)

    with caplog.at_level(logging.WARNING, logger="countvae"):
        fits = run(adata, out, refit_broken=True)
    assert fits.reused_seeds == sorted(intact)
    assert_same_numbers(fits, reference)
    assert {s: files_of(fits_dir / f"seed_{s}") for s in intact} == intact, "an intact seed was rewritten"
    # The damaged folders were moved aside with their bytes, not deleted.
    aside = sorted((out / "broken").iterdir())
    assert [p.name.split(".")[0] for p in aside] == [f"seed_{s}" for s in damaged]
    assert [files_of(p) for p in aside] == [damaged_bytes[s] for s in damaged]
    assert all(f"Seed {s}" in caplog.text for s in damaged) and "refitting" in caplog.text
    assert run(adata, out).reused_seeds == [0, 1, 2]


def test_other_data_or_settings_or_a_damaged_manifest_are_refused_with_remedy(adata, complete, tmp_path):
    out = tmp_path / "out"
    _copy(complete, out)
    with pytest.raises(OutputExistsError, match=r"(?s)data: the fits were made on other data.*pass overwrite=True"):
        run(tiny_data(seed=6), out)
    with pytest.raises(OutputExistsError, match=r"(?s)model_kwargs.*Rerun with the recorded settings"):
        run(adata, out, model_kwargs={"n_latent": 3, "n_hidden": 8, "decoder": "linear"})
    _truncate(out / "manifest.json")
    with pytest.raises(ModelFileError, match=r"manifest\.json is not valid JSON.*pass overwrite=True"):
        run(adata, out)
    manifest = json.loads((complete / "manifest.json").read_text())
    assert manifest["seeds"] == [0, 1, 2]
    assert run(adata, out, overwrite=True).reused_seeds == []
