"""One truth per quantity: every sentence of the headline agrees with the tables, the files and the JSON.

Each sentence that names quantities or components starts with a fixed label
(:data:`countvae.diagnostics.reporting.headline.LEADS`); the test reads the names
back out of the sentence and compares them with the verdicts in the invariants
table, the ICA component table, the predictive-equivalence decision and the
ground-truth table, on real reports (seeds and exact copies).
"""

from __future__ import annotations

import copy
import json
import re

import pytest

from countvae.diagnostics.reporting.headline import ICA_LEAD, LEADS, PREDICTIVE_LEADS, TRUTH_LEAD
from countvae.diagnostics.reporting.verdicts import AGREE, ALIGNED, DIFFER, NOT_MEASURED, UNDETERMINED


def _names(sentence: str, lead: str) -> list[str]:
    """The comma-separated names after ``lead`` up to the first full stop that ends the list."""
    body = sentence[len(lead) :].strip()
    listed = body.split(". ", 1)[0].rstrip(".")
    return [] if listed == "none" else [name.strip() for name in listed.split(", ")]


def check_headline(rep) -> None:
    """Assert that every headline sentence states what the tables hold, and nothing else."""
    table = rep.invariants.set_index("quantity")
    theory = table["invariant_in_theory"]
    expected = {
        AGREE: set(table.index[table["verdict"] == AGREE]),
        ALIGNED: set(table.index[table["verdict"] == ALIGNED]),
        "differ_invariant": set(table.index[(table["verdict"] == DIFFER) & (theory == "yes")]),
        "differ_other": set(table.index[(table["verdict"] == DIFFER) & (theory != "yes")]),
        UNDETERMINED: set(table.index[table["verdict"] == UNDETERMINED]),
    }
    n_fits = len(rep.provenance["fits"])
    seeds = "both seeds" if n_fits == 2 else f"all {n_fits} seeds"
    leads = {key: lead.format(seeds=seeds) for key, lead in LEADS.items()}
    found = {}
    for line in rep.headline:
        for key, lead in leads.items():
            if line.startswith(lead):
                assert key not in found, f"two sentences for {key}"
                found[key] = set(_names(line, lead))
    assert AGREE in found, rep.headline  # the first sentence is always there, "none" when empty
    for key, names in expected.items():
        assert found.get(key, set()) == names, (key, found.get(key), names)
    # Every measured row is named exactly once.
    named = [q for names in found.values() for q in names]
    assert sorted(named) == sorted(table.index[table["verdict"] != NOT_MEASURED])
    for quantity in expected[UNDETERMINED]:
        line = next(line for line in rep.headline if line.startswith(leads[UNDETERMINED]))
        reason, remedy = table.loc[quantity, "reason"], table.loc[quantity, "remedy"]
        if quantity == "held-out log p(x)":
            # Said once, in the predictive sentence; the undetermined sentence points to it.
            assert f"{quantity} (see the sentence on predictive equivalence)" in line
            assert sum(reason in sentence for sentence in rep.headline) == 1, (quantity, reason)
        elif quantity == "ICA coordinates":
            # Said once, in the ICA components sentence (per component, with what would decide it).
            assert f"{quantity} (see the sentence on ICA components)" in line
            ica_line = next(sentence for sentence in rep.headline if sentence.startswith(ICA_LEAD))
            for why in rep.ica.loc[rep.ica["verdict"] == UNDETERMINED, "remedy"]:
                assert f"to decide: {why}" in ica_line
                assert sum(why in sentence for sentence in rep.headline) == 1, (quantity, why)
        else:
            assert f"{quantity} ({reason}; to decide: {remedy})" in line
            assert sum(reason in sentence for sentence in rep.headline) == 1, (quantity, reason)

    # Predictive equivalence: the sentence, the row and the recorded decision say the same.
    state = rep.settings["predictive_equivalence"]["state"]
    sentences = [line for line in rep.headline if any(line.startswith(lead) for lead in PREDICTIVE_LEADS.values())]
    assert len(sentences) == 1 and sentences[0].startswith(PREDICTIVE_LEADS[state])
    row = {"equivalent": AGREE, "not equivalent": DIFFER, "undetermined": UNDETERMINED}.get(state, NOT_MEASURED)
    assert table.loc["held-out log p(x)", "verdict"] == row
    assert rep.settings["predictively_equivalent"] == {"equivalent": True, "not equivalent": False}.get(state)

    # ICA: the components the sentence names under each verdict are those of the component table.
    ica = rep.ica
    lines = [line for line in rep.headline if line.startswith(ICA_LEAD)]
    if len(ica):
        assert len(lines) == 1
        listed = lines[0].split("): ", 1)[1]
        for verdict, text in ((AGREE, "agrees? across seeds"), (DIFFER, "differs? between seeds")):
            match = re.search(rf"((?:IC_\d+, )*IC_\d+) {text}", listed)
            said = set(match.group(1).split(", ")) if match else set()
            assert said == set(ica.loc[ica["verdict"] == verdict, "component"]), (verdict, listed)
        undecided = set(re.findall(r"((?:IC_\d+, )*IC_\d+) undetermined", listed))
        said = {c for group in undecided for c in group.split(", ")}
        assert said == set(ica.loc[ica["verdict"] == UNDETERMINED, "component"]), listed
        # The ICA row is the components' verdicts put together, never another estimate.
        verdicts = set(ica["verdict"])
        row = AGREE if verdicts == {AGREE} else DIFFER if DIFFER in verdicts else UNDETERMINED
        assert table.loc["ICA coordinates", "verdict"] == row
        assert table.loc["ICA coordinates", "agreement"] == pytest.approx(ica["corrected_match"].min())
    else:
        assert not lines

    # Ground truth: the numbers in the sentence are the table's worst and best over seeds.
    truth = rep.tables.get("ground_truth")
    lines = [line for line in rep.headline if line.startswith(TRUTH_LEAD)]
    if truth is not None and len(truth):
        assert len(lines) == 1
        for kind, sub in truth.groupby("coordinates"):
            text = f"{kind} coordinates MCC {sub['mcc'].min():.2f} to {sub['mcc'].max():.2f}"
            assert text in lines[0]
    else:
        assert not lines

    # The files carry the same headline and verdicts.
    record = rep.to_dict()
    assert record["headline"] == rep.headline
    assert [r["verdict"] for r in record["tables"]["invariants"]] == rep.invariants["verdict"].tolist()
    assert json.loads(json.dumps(record))["settings"]["predictive_equivalence"]["state"] == state
    markdown = rep.to_markdown()
    assert all(f"- {line}" in markdown for line in rep.headline)


def test_headline_of_real_seeds_agrees_with_the_tables(seed_report):
    check_headline(seed_report)


def test_headline_of_exact_copies_agrees_with_the_tables(copies_report):
    check_headline(copies_report)
    assert copies_report.headline[0].startswith("Agree across all 3 seeds: held-out log p(x), posterior predictive")


def test_the_check_catches_a_headline_that_contradicts_the_table(copies_report):
    """The check is not vacuous: a sentence that lists a row under the wrong verdict fails it."""
    broken = copy.deepcopy(copies_report)
    broken.headline[0] = broken.headline[0].replace("decoded means, ", "")
    with pytest.raises(AssertionError):
        check_headline(broken)
    broken = copy.deepcopy(copies_report)
    broken.tables["invariants"].loc[broken.invariants["quantity"] == "ICA coordinates", "verdict"] = DIFFER
    with pytest.raises(AssertionError):
        check_headline(broken)
    broken = copy.deepcopy(copies_report)
    broken.settings["predictive_equivalence"]["state"] = "not equivalent"
    with pytest.raises(AssertionError):
        check_headline(broken)
