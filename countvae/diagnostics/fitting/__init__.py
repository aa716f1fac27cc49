"""Fitting room: one model from several seeds on a shared held-out split, the fits' common interface, and their storage.

Modules: :mod:`.fit_seeds` (``fit_seeds``, ``load_seed_fits``), :mod:`.heldout` (the split), :mod:`.output_folder`
(the resumable folder: lock, manifest check, atomic storing, reading back), :mod:`.manifest` (what determines the
fits), :mod:`.seed_job` (one seed's fit, runnable in a worker), :mod:`.parallelism` (seeds at once: cores, memory),
:mod:`.backends` (local, joblib, Ray), :mod:`.progress` (a run's events), :mod:`.fitted_model` (the ``FittedModel``
protocol, ``CountVAEFit``), :mod:`.scvi_fit` (``SCVIFit``), :mod:`.scvi_storage` (scvi-tools: import, set-up, safe
saving and loading), :mod:`.seed_fits` (``SeedFits``). Nothing here imports the analyses or the report.
"""
