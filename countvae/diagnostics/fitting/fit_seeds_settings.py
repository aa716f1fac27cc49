"""The settings of :func:`~countvae.diagnostics.fit_seeds`, each written once as a field.

``fit_seeds`` takes the fields as keywords (or one :class:`FitSeedsSettings`), its signature and
"Parameters" generated from them (:mod:`countvae._settings`); it checks them against its data.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from countvae._settings import documents_settings, setting
from countvae.diagnostics.fitting.parallelism import AUTO
from countvae.diagnostics.fitting.progress import Progress
from countvae.model import CountVAE

__all__ = ["FitSeedsSettings"]


@documents_settings()
@dataclass(frozen=True)
class FitSeedsSettings:
    """How :func:`~countvae.diagnostics.fit_seeds` fits its seeds, and where it stores them.

    Attributes
    ----------
    {settings}

    """

    seeds: Iterable[int] = setting(
        range(5),
        """At least two distinct integers in ``[0, 2**32 - 1]``. A countvae fit uses ``CountVAE.train(seed=s)``;
        an scvi-tools fit sets ``scvi.settings.seed = s`` before construction and training (global random states
        are restored afterwards).""",
    )
    model_kwargs: dict[str, Any] | None = setting(
        None,
        """Constructor arguments (e.g. ``{"n_latent": 10, "likelihood": "nb"}`` for countvae,
        ``{"n_latent": 10, "gene_likelihood": "nb"}`` for scvi).""",
    )
    train_kwargs: dict[str, Any] | None = setting(
        None, """Arguments of ``train`` (e.g. ``{"max_epochs": 100}``); not ``seed``."""
    )
    heldout_fraction: float = setting(0.1, "Fraction of cells, in (0, 1), held out from every fit.")
    split_seed: int = setting(0, "Seed of the held-out split (the same split for all seeds).")
    n_jobs: int | str = setting(
        AUTO,
        """Seeds fitted at once: joblib worker processes (local backend) or Ray tasks in flight. ``"auto"``
        (default): one seed per ``torch_threads`` usable cores (affinity and cgroup quotas respected), at most the
        seeds left to fit, fewer when the workers' copies of in-memory data (or the layers of a backed file, which
        anndata reads whole into each) would not fit in the available memory, and one at a time in this process
        when ``progress`` cannot be copied into workers or each seed is too short to repay starting a worker (under
        ``MIN_STEPS_FOR_WORKERS`` minibatch steps), each with a logged reason (see
        :mod:`countvae.diagnostics.fitting.parallelism`). ``-1``: the same without the fall-back for
        ``progress`` (Ray: every seed in flight). ``1`` fits in this process. The fits are the same whatever the
        number (each keeps its ``torch_threads``); ``settings["n_jobs"]`` records the number used.""",
    )
    out_dir: str | os.PathLike | None = setting(
        None,
        """Folder to save the fits in (see :mod:`countvae.diagnostics.fitting.fit_seeds`: resumable). With
        ``None`` the fits live in memory only.""",
    )
    backend: str = setting(
        "local",
        """``"local"`` or ``"ray"`` (each seed a Ray task on whatever ``ray.init`` connects to; a small local
        instance is started when Ray is not initialised). Ray is an optional dependency (the ``[ray]`` extra).""",
    )
    model_cls: type = setting(
        CountVAE, """:class:`countvae.CountVAE` (default), ``scvi.model.SCVI`` or ``scvi.model.LinearSCVI``."""
    )
    overwrite: bool = setting(False, "Discard fits already in ``out_dir`` and fit every seed again.")
    progress_bar: bool = setting(
        True,
        """Show a progress bar over seeds (each fit's own bar is off unless ``train_kwargs`` turns it on).""",
    )
    torch_threads: int | None = setting(
        None,
        """Torch threads per fit (``None``: 1, whatever the machine, the backend and ``n_jobs``). On CPU the numbers
        depend on it (it sets the order in which torch sums), so it is fixed rather than taken from the machine (cores,
        CPU quota, affinity, ``LOKY_MAX_CPU_COUNT``, ``n_jobs``): the same seeds give the same fits on every machine.
        Recorded in the manifest; a resumed run must use the same value. More threads can speed up one large fit on an
        otherwise idle machine; ``n_jobs`` uses the cores for several seeds at once without changing the numbers.""",
    )
    progress: Progress | None = setting(
        None,
        """Called with a :class:`~countvae.diagnostics.fitting.progress.ProgressEvent` as each seed is started,
        trained, written, stored or reused. Started and trained are reported where the fit runs: with worker
        processes or Ray tasks, ``progress`` is copied into them and must be picklable (see
        :mod:`countvae.diagnostics.fitting.progress`).""",
    )
    refit_broken: bool = setting(
        False,
        """When a stored seed folder in ``out_dir`` is damaged (a file truncated, empty, altered or swapped), move
        it to ``out_dir/broken/`` and refit that seed, keeping every intact one. Without it such a folder stops the
        run with an error naming the folder, the file and this remedy.""",
    )
