"""Can the first epochs of a fit predict where the shared stopping rule will end it?

    python benchmarks/stop_forecast.py --store /tmp/st/stopping_vs_full.json

Reads the full 400-epoch validation-loss trajectories stored by ``bench_stopping.py --versus-full``. For each fit
and each horizon K, fits ``a + b * t ** -c`` (``scipy.optimize.curve_fit``) to the validation loss of the even
epochs 2..K, runs the shared rule (``countvae.model.training.ConvergenceRule`` at ``DEFAULT_STOPPING``'s settings)
on the extrapolated curve, and sets the predicted stop against the rule's stop on the measured curve. Prints a
Markdown table; the finding is quoted in the run notes of RESULTS.md's stopping-vs-full section. It is why the
time estimate predicts the stop from the genes (``countvae.model.warmup.expected_stop_epoch``) instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _common  # noqa: F401  (puts the checkout on the path)
import numpy as np
from scipy.optimize import curve_fit

from countvae.model.training import DEFAULT_STOPPING, ConvergenceRule


def rule_stop(curve: np.ndarray) -> int:
    """The epoch at which the shared rule stops on ``curve`` (``curve[e - 1]``: the loss after epoch ``e``)."""
    rule = ConvergenceRule(DEFAULT_STOPPING.patience, DEFAULT_STOPPING.relative_delta)
    every = DEFAULT_STOPPING.check_val_every_n_epoch
    for epoch in range(every, len(curve) + 1, every):
        if rule.update(epoch, float(curve[epoch - 1]))[1]:
            return epoch
    return len(curve)


def power_decay(t: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
    """``a + b t^-c``: a loss falling towards ``a``."""
    return a + b * t ** (-c)


def forecast(curve: np.ndarray, horizon: int) -> int:
    """The stop predicted from the even epochs up to ``horizon``."""
    epochs = np.arange(2, horizon + 1, 2, dtype=float)
    losses = curve[epochs.astype(int) - 1]
    start = (losses[-1], losses[0] - losses[-1], 1.0)
    params, _ = curve_fit(
        power_decay, epochs, losses, p0=start, bounds=([0, 0, 0.05], [np.inf, np.inf, 5.0]), maxfev=20_000
    )
    return rule_stop(power_decay(np.arange(1, len(curve) + 1, dtype=float), *params))


def main(argv: list[str] | None = None) -> int:
    """Print the predicted against the measured stop for each stored fit and horizon."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="stopping_vs_full.json of bench_stopping.py")
    parser.add_argument("--horizons", default="10,16,20,24", help="comma-separated last epochs used")
    args = parser.parse_args(argv)
    horizons = [int(h) for h in args.horizons.split(",")]
    print("| data | seed | measured stop | " + " | ".join(f"predicted from epochs 2-{h}" for h in horizons) + " |")
    print("|---|---|---|" + "---|" * len(horizons))
    for record in json.loads(args.store.read_text()):
        curve = np.asarray(record["full"]["loss_validation"], dtype=float)
        predicted = [forecast(curve, h) for h in horizons]
        cells = [record["dataset"], record["seed"], rule_stop(curve), *predicted]
        print("| " + " | ".join(map(str, cells)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
