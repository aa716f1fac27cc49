"""report.json: its shipped JSON Schema, and ``load_report`` reading a saved report back into the same object.

Known answers: the schema accepts what ``save`` writes and refuses the same file
with one entry corrupted; a saved and loaded report equals the original in every
table (values, columns, dtypes), sentence and setting, and differs from it as
soon as one saved number is changed; files that are missing, not countvae
reports or of a newer format are refused with the remedy.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from diagnostics_helpers import assert_valid_report_json
from jsonschema import Draft202012Validator, ValidationError

from countvae.diagnostics import DiagnosticReport, DownstreamSettings, load_report
from countvae.diagnostics.analyses.predictive import EQUIVALENT, NOT_EQUIVALENT, UNDETERMINED
from countvae.diagnostics.reporting.downstream_section import downstream_result
from countvae.diagnostics.reporting.report_content import MAIN_TABLES
from countvae.diagnostics.reporting.report_format import FORMAT_NAME, FORMAT_VERSION, SCHEMA_FILE, report_schema
from countvae.diagnostics.reporting.verdicts import NOT_TESTED, VERDICTS
from countvae.errors import CountVAEError, ReportFileError


@pytest.fixture(scope="module")
def saved(seed_report, tmp_path_factory):
    """The seed report saved once: (folder, parsed report.json)."""
    folder = seed_report.save(tmp_path_factory.mktemp("saved") / "report")
    return folder, json.loads((folder / "report.json").read_text(encoding="utf-8"))


def _write(tmp_path, record) -> str:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    return str(path)


# ----- the schema -----------------------------------------------------------------------------------------------
def test_schema_is_a_valid_draft_2020_12_schema_of_this_format_version():
    schema = report_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["format"] == {"const": FORMAT_NAME}
    assert schema["properties"]["format_version"] == {"const": FORMAT_VERSION}
    assert schema["$id"].endswith(f":{FORMAT_VERSION}")
    assert SCHEMA_FILE.parent.name == "reporting" and SCHEMA_FILE.is_file()
    # the enumerations are the code's own
    assert schema["$defs"]["verdict"]["enum"] == list(VERDICTS)
    states = schema["properties"]["settings"]["properties"]["predictive_equivalence"]["properties"]["state"]["enum"]
    assert set(states) == {EQUIVALENT, NOT_EQUIVALENT, UNDETERMINED, NOT_TESTED}
    # each main table is required unless settings.sections names the sections and leaves its own out
    conditional = [c["else"]["properties"].get("tables", {}).get("required", [None])[0] for c in schema["allOf"]]
    assert [t for t in conditional if t is not None] == list(MAIN_TABLES)


def test_saved_report_json_validates_against_the_schema(saved):
    _, record = saved
    assert record["format"] == FORMAT_NAME and record["format_version"] == FORMAT_VERSION
    assert_valid_report_json(record)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda r: r["tables"]["invariants"][0].update(verdict="probably"),
        lambda r: r["tables"]["invariants"][0].update(agreement="0.9"),
        lambda r: r["tables"]["invariants"][0].pop("threshold"),
        lambda r: r["tables"]["ica"][0].update(verdict="yes"),
        lambda r: r["tables"].pop("rhat"),
        lambda r: r.pop("headline"),
        lambda r: r.update(headline=[]),
        lambda r: r.update(format_version=FORMAT_VERSION + 1),
        lambda r: r.update(format=1),
        lambda r: r["table_columns"]["invariants"][0].pop("dtype"),
        lambda r: r["settings"]["predictive_equivalence"].update(state="fine"),
        lambda r: r["provenance"]["versions"].pop("countvae"),
        lambda r: r.update(downstream={"statements": []}),
        lambda r: r["tables"]["batch_mixing"][0].pop("heldout_cells"),
        lambda r: r["tables"]["batch_mixing"][0].update(batch_mixing=-0.1),
    ],
    ids=[
        "unknown verdict",
        "agreement as text",
        "no threshold",
        "ica verdict",
        "main table missing",
        "no headline",
        "empty headline",
        "newer version",
        "old format field",
        "column without dtype",
        "predictive state",
        "no countvae version",
        "partial downstream",
        "batch mixing without heldout_cells",
        "negative batch mixing",
    ],
)
def test_schema_refuses_a_corrupted_report_json(saved, corrupt):
    record = copy.deepcopy(saved[1])
    corrupt(record)
    with pytest.raises(ValidationError):
        assert_valid_report_json(record)


# ----- load_report ----------------------------------------------------------------------------------------------
def test_load_report_gives_back_the_same_report(seed_report, saved):
    folder, _ = saved
    for path in (folder, folder / "report.json", str(folder)):
        loaded = load_report(path)
        assert isinstance(loaded, DiagnosticReport)
        assert loaded.to_dict() == seed_report.to_dict()
        assert loaded.summary() == seed_report.summary() and loaded.headline == seed_report.headline
    assert list(loaded.tables) == list(seed_report.tables)
    for name, table in seed_report.tables.items():  # values, columns, their order and dtypes, index
        pd.testing.assert_frame_equal(loaded.tables[name], table, check_exact=True, obj=name)
    pd.testing.assert_frame_equal(loaded.invariants, seed_report.invariants, check_exact=True)
    assert loaded.settings["predictive_equivalence"] == seed_report.settings["predictive_equivalence"]
    assert loaded.settings == json.loads(json.dumps(seed_report.to_dict()["settings"]))  # settings in JSON form
    assert loaded.subsampling == seed_report.subsampling and loaded.timings == seed_report.timings
    assert loaded.provenance == seed_report.to_dict()["provenance"] and loaded.downstream is None
    assert loaded.to_markdown() == seed_report.to_markdown()


def test_a_loaded_report_gives_the_same_model_card_when_no_margin_could_be_stated(seed_report, tmp_path):
    # Fits that explain nothing beyond a model without latent variables have no margin (NaN, saved as null):
    # the loaded report's card read "a margin of None nats per cell".
    record = {**seed_report.settings["predictive_equivalence"], "margin_nats_per_cell": float("nan")}
    rep = dataclasses.replace(seed_report, settings={**seed_report.settings, "predictive_equivalence": record})
    loaded = load_report(rep.save(tmp_path / "report"))
    assert loaded.settings["predictive_equivalence"]["margin_nats_per_cell"] is None
    assert "a margin of n/a nats per cell" in rep.model_card()
    assert loaded.model_card() == rep.model_card()


def test_the_folder_of_a_diagnose_run_loads_its_report(seed_report, tmp_path):
    """``countvae diagnose --out OUT`` saves the report in OUT/report: load_report(OUT) reads it."""
    seed_report.save(tmp_path / "out" / "report")
    assert load_report(tmp_path / "out").to_dict() == load_report(tmp_path / "out" / "report").to_dict()
    with pytest.raises(ReportFileError, match=r"the --out folder of `countvae diagnose`"):
        load_report(tmp_path)


def test_a_report_with_one_entry_changed_does_not_load_equal(seed_report, saved, tmp_path):
    record = copy.deepcopy(saved[1])
    record["tables"]["invariants"][2]["agreement"] += 1e-9
    loaded = load_report(_write(tmp_path, record))
    assert loaded.to_dict() != seed_report.to_dict()
    with pytest.raises(AssertionError):
        pd.testing.assert_frame_equal(loaded.invariants, seed_report.invariants, check_exact=True)
    record = copy.deepcopy(saved[1])
    record["headline"][0] += "!"
    assert load_report(_write(tmp_path, record)).summary() != seed_report.summary()


def test_a_table_without_rows_keeps_its_columns_and_dtypes(seed_report, tmp_path):
    empty = seed_report.tables["ica"].iloc[:0]
    rep = dataclasses.replace(seed_report, tables={**seed_report.tables, "ica": empty})
    loaded = load_report(rep.save(tmp_path / "report"))
    pd.testing.assert_frame_equal(loaded.ica, empty.reset_index(drop=True))
    assert list(loaded.ica.columns) == list(seed_report.ica.columns) and loaded.to_dict() == rep.to_dict()


def test_a_loaded_downstream_section_keeps_its_columns_and_dtypes(saved, tmp_path):
    """Downstream without DE (clusters and UMAP off: the latent k-NN overlap only): no pair has a DE Jaccard, so the
    ``chance`` and ``chance_mean`` columns are all missing numbers (saved as null). Read back with the recorded dtypes
    they are float NaN again, not the ``None`` objects pandas would infer from the nulls."""
    rng = np.random.default_rng(0)
    latents = {f"seed{k}": rng.normal(size=(60, 3)) for k in range(3)}
    section = downstream_result(None, latents, 60, DownstreamSettings(k=8, clusters=False, umap=False))
    assert section.pairs["chance"].isna().all() and section.summary["chance_mean"].isna().all()
    record = {**copy.deepcopy(saved[1]), "downstream": section.to_dict()}
    loaded = load_report(_write(tmp_path, record)).downstream
    assert loaded.pairs["chance"].dtype == np.float64 and loaded.summary["chance_mean"].dtype == np.float64
    for name in ("summary", "pairs"):
        pd.testing.assert_frame_equal(loaded.tables[name], section.tables[name], check_exact=True, obj=name)
    assert loaded.de_per_fit.empty and loaded.de_per_fit.columns.empty  # no DE: no rows, no columns


def test_format_version_1_loads_with_inferred_dtypes(seed_report, saved, tmp_path):
    record = copy.deepcopy(saved[1])
    record.update(format=1)
    del record["format_version"], record["table_columns"]
    loaded = load_report(_write(tmp_path, record))
    assert loaded.summary() == seed_report.summary() and loaded.settings == saved[1]["settings"]
    pd.testing.assert_frame_equal(loaded.invariants, seed_report.invariants, check_dtype=False)
    # version 1 has no schema: the keys the reader needs are checked one by one
    partial = {**record, "downstream": {"statements": []}}
    with pytest.raises(ReportFileError, match="its 'downstream' section is incomplete or was altered"):
        load_report(_write(tmp_path, partial))
    del record["tables"]
    with pytest.raises(ReportFileError, match="no 'tables' dict.*incomplete or was altered"):
        load_report(_write(tmp_path, record))


def test_load_report_refuses_what_it_cannot_read(saved, tmp_path):
    record = saved[1]
    with pytest.raises(ReportFileError, match="does not exist.*DiagnosticReport.save"):
        load_report(tmp_path / "nowhere")
    with pytest.raises(ReportFileError, match="does not exist"):
        load_report(tmp_path)  # a folder without report.json
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(record)[:500], encoding="utf-8")
    with pytest.raises(ReportFileError, match="not valid JSON.*save the report again"):
        load_report(broken)
    cases = {
        "not a countvae multi-seed diagnostic report": [1, 2],
        "format 'countvae-model'": {"format": "countvae-model", "format_version": 1},
        "another countvae report: 'Restrictions'": {"title": "Restrictions", "headline": [], "tables": {}},
        "newer than this countvae reads.*upgrade countvae": {**record, "format_version": FORMAT_VERSION + 1},
        "unknown format version 'two'": {**record, "format_version": "two"},
        "unknown format version 0": {**record, "format_version": 0},
        # a version-1 marker on a file that also names its version: neither version 1 nor this format
        r"not a countvae multi-seed diagnostic report \(format 1\)": {**record, "format": 1},
        "at the top: 'tables' is a required property.*incomplete or was altered": {
            k: v for k, v in record.items() if k != "tables"
        },
        "at downstream: .* is not valid under any of the given schemas": {**record, "downstream": {"statements": []}},
        "at tables/rhat/0: 1 is not of type 'object'": {**record, "tables": {**record["tables"], "rhat": [1, 2]}},
        "table 'ica' cannot be read back": {
            **record,
            "table_columns": {**record["table_columns"], "ica": [{"name": "verdict", "dtype": "no such dtype"}]},
        },
        "at table_columns: the value breaks the rule 'type': 'object'": {
            **record,
            "table_columns": list(record["table_columns"]),
        },
        # hand edits the reader once accepted and the renderers then failed on
        "at settings: 'report' is a required property": {**record, "settings": {}},
        "at headline/0: 1 is not of type 'string'": {**record, "headline": [1, *record["headline"]]},
    }
    for message, content in cases.items():
        with pytest.raises(ReportFileError, match=message) as info:
            load_report(_write(tmp_path, content))
        assert isinstance(info.value, CountVAEError) and isinstance(info.value, OSError)
