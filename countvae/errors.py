"""The errors countvae raises on purpose.

Every error a user can trigger through bad input or misuse is one of these classes. Each subclasses the built-in
exception a Python user would expect (``ValueError`` for bad values, ``FileNotFoundError`` for missing files...), so
``except ValueError`` keeps working, and ``except CountVAEError`` catches all this package raises deliberately.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path


class CountVAEError(Exception):
    """Base class of every error countvae raises on purpose."""


class InvalidDataError(CountVAEError, ValueError):
    """The count matrix or its annotations cannot be used as given."""


class SetupError(CountVAEError, ValueError):
    """The AnnData was not registered, or is registered differently from the model."""


class InvalidArgumentError(CountVAEError, ValueError):
    """A parameter has a value outside what the function accepts."""


class UnknownArgumentError(InvalidArgumentError, TypeError):
    """A function got a keyword it does not take.

    A ``TypeError``, as Python's own error for an unknown keyword, that names the closest valid keyword or, for
    scvi-tools' keywords, what to use instead.
    """


class NotTrainedError(CountVAEError, RuntimeError):
    """A method that needs a trained model was called before ``train``."""


class TrainingDivergedError(CountVAEError, FloatingPointError):
    """The loss or the gradients became non-finite during training."""


class DataFileNotFoundError(CountVAEError, FileNotFoundError):
    """A dataset file could not be found where countvae looked for it."""


class ModelFileError(CountVAEError, OSError):
    """A saved model folder is missing a file, is corrupted or has another format."""


class ReportFileError(CountVAEError, OSError):
    """A saved report is missing, is not a countvae report of the kind asked for, or has a format it cannot read.

    The message says which, and what to do (save the report again, or upgrade countvae for a newer format).
    """


class OutputExistsError(CountVAEError, FileExistsError):
    """An output would overwrite an existing file or folder without ``overwrite=True``.

    ``kept`` is where a refusal at the end of a write kept its result (``.<name>.countvae-<random>.kept``, as the
    message says), else ``None``.
    """

    kept: Path | None = None


class OutputLockedError(OutputExistsError):
    """Another running process is writing the same output folder; the message names it (pid, host, start)."""


class OutputWriteError(CountVAEError, OSError):
    """Writing an output failed (disk full, read-only or not writable); nothing was left half-written.

    ``errno`` is the operating system's error number (``errno.ENOSPC``, ``errno.EROFS``...).
    """

    def __str__(self) -> str:
        # OSError would prefix "[Errno n]" and drop the message once errno is set.
        return str(self.args[0]) if self.args else ""


class BrokenFitError(ModelFileError):
    """A stored fit of a multi-seed run is damaged; ``folder`` is its seed folder, ``seed`` its seed.

    The message names the file and the remedy (``refit_broken=True``, ``--refit-broken``; where that cannot be set,
    moving the folder aside);
    ``problem`` is what is wrong, without the remedy; ``folders`` every damaged seed folder (``[folder]`` by default).
    """

    def __init__(self, message: str, seed: int, folder: str, problem: str = "", folders: Sequence[str] = ()):
        super().__init__(message)
        self.seed = seed
        self.folder = folder
        self.problem = problem or message
        self.folders = list(folders) or [folder]


class WorkerLostError(CountVAEError, RuntimeError):
    """A worker process died while fitting (killed, often by the out-of-memory killer); finished fits are kept."""


class MissingDependencyError(CountVAEError, ImportError):
    """An optional package that a feature needs is not installed; the message names the extra to install."""


class CountVAEWarning(UserWarning):
    """Base class of the warnings countvae issues on purpose."""


class NonIdentifiableComponentsWarning(CountVAEWarning):
    """Several ICA components are too close to Gaussian for ICA to tell them apart.

    The data determine their span, not the axes inside it: report them as one subspace (compare it across fits by
    principal angles), not as axes.
    """


class MonteCarloWarning(CountVAEWarning):
    """A Monte Carlo estimate is too noisy for its purpose; the message says which and how many draws to use."""


class UnreliableEstimateWarning(CountVAEWarning):
    """Some cells' importance-sampled ``log p(x)`` failed the Pareto k-hat check.

    The message gives their number and remedy; the per-cell column ``reliable`` says which; their standard error is NaN.
    """
