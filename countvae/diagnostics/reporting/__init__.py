"""Reporting room: ``report(fits, adata_heldout)`` as a pipeline, and the report it returns.

:mod:`.pipeline` runs the steps in order: :mod:`.collect` visits each fit once for the arrays the sections need, each
section of :mod:`.sections` computes its tables, verdict rows and sentences from those arrays (:mod:`.verdicts` holds
the decision rules, :mod:`.headline` the wording), and :mod:`.diagnostic_report` holds the result, which
:mod:`.render_html`, :mod:`.render_markdown` and :mod:`.render_json` only render; :mod:`.load_report` reads a saved
report.json (format: :mod:`.report_format`) back.

The room is named ``reporting`` rather than ``report`` because ``countvae.diagnostics.report`` is the public function.
"""
