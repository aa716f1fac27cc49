"""Convergence-based stopping: the rule, how often validation runs, and what is recorded."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

import countvae as cv
from countvae.data.loader import CountSource
from countvae.data.registry import batch_codes, get_count_matrix
from countvae.diagnostics.fitting.default_training import DIAGNOSE_STOPPING, default_epochs, diagnose_train_kwargs
from countvae.model.training import DEFAULT_STOPPING, ConvergenceRule, EarlyStopping, TrainingPlan, evaluate_loss


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _params(model):
    return torch.cat([p.detach().flatten().clone() for p in model.module.state_dict().values()])


def _validation_loss(model, seed: int) -> float:
    """The validation loss as training computes it (the noise is seeded by the fit's seed)."""
    src = CountSource(get_count_matrix(model.adata, model.registry), batch_codes(model.adata, model.registry))
    return evaluate_loss(model.module, src, model.validation_indices, 512, seed=seed)


def test_rule_on_a_sequence_worked_by_hand():
    # relative delta 1%: an improvement counts when the loss falls more than 1% below the reference
    rule = ConvergenceRule(patience=3, relative_delta=0.01)
    outcomes = [rule.update(epoch, loss) for epoch, loss in enumerate([100.0, 95.0, 94.5, 94.2, 94.1], start=1)]
    # 100 sets the reference; 95 < 99 counts (reference 95, epoch 2); 94.5, 94.2, 94.1 are above 94.05:
    # they are new bests but do not count, and at epoch 5, 3 epochs have passed since epoch 2
    assert outcomes == [(True, False), (True, False), (True, False), (True, False), (True, True)]
    assert rule.best == 94.1 and rule.best_epoch == 5 and rule.reference == 95.0 and rule.last_improvement == 2


def test_rule_with_zero_delta_counts_every_improvement_and_ignores_worse_epochs():
    rule = ConvergenceRule(patience=2, relative_delta=0.0)
    losses = [10.0, 9.0, 9.5, 8.9, 9.2, 9.1]
    stops = [rule.update(e, x)[1] for e, x in enumerate(losses, start=1)]
    assert stops == [False, False, False, False, False, True]  # last improvement at epoch 4, stop at 4 + 2
    assert rule.best_epoch == 4 and rule.best == 8.9


def test_rule_never_takes_a_nan_loss_as_reference():
    rule = ConvergenceRule(patience=1, relative_delta=0.0)
    assert rule.update(1, math.nan) == (False, False)
    assert rule.update(2, 5.0) == (True, False)
    assert rule.update(3, math.nan) == (False, True)
    assert rule.best_epoch == 2


def test_validating_less_often_does_not_change_the_fit(small_adata):
    every = cv.CountVAE(small_adata, n_latent=2, n_hidden=16)
    every.train(max_epochs=7, seed=3, progress_bar=False, early_stopping=False)
    sparse = cv.CountVAE(small_adata, n_latent=2, n_hidden=16)
    sparse.train(max_epochs=7, seed=3, progress_bar=False, early_stopping=False, check_val_every_n_epoch=3)
    assert torch.equal(_params(every), _params(sparse))
    np.testing.assert_array_equal(every.history["loss_train"], sparse.history["loss_train"])
    validated = sparse.history["loss_validation"].notna().to_numpy()
    assert validated.tolist() == [False, False, True, False, False, True, True]  # every 3rd and the last
    np.testing.assert_array_equal(
        sparse.history["loss_validation"][validated], every.history["loss_validation"][validated]
    )


def test_early_stopping_stops_where_the_rule_says_and_keeps_the_best_checked_epoch(small_adata):
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=16)
    m.train(
        max_epochs=300,
        lr=3e-2,
        seed=1,
        progress_bar=False,
        early_stopping=True,
        early_stopping_patience=6,
        early_stopping_relative_delta=1e-3,
        early_stopping_lr_reductions=0,
        check_val_every_n_epoch=2,
    )
    h = m.history
    summary = m.training_summary
    assert summary["stopped_early"] and summary["epochs_trained"] == len(h) < 300
    # Replay the rule on the recorded validation losses: it must stop at the same epoch.
    rule = ConvergenceRule(patience=6, relative_delta=1e-3)
    checked = h.dropna(subset=["loss_validation"])
    assert checked["epoch"].tolist() == list(range(2, len(h) + 1, 2))
    stops = [
        rule.update(int(e), float(v))[1] for e, v in zip(checked["epoch"], checked["loss_validation"], strict=True)
    ]
    assert stops[-1] and not any(stops[:-1])
    best = checked.loc[checked["loss_validation"].idxmin()]
    assert summary["kept_epoch"] == int(best["epoch"]) == rule.best_epoch
    assert _validation_loss(m, seed=1) == pytest.approx(float(best["loss_validation"]), rel=1e-6)


def test_a_learning_rate_cut_restarts_the_patience_from_the_best_parameters(small_adata):
    """The rule fires twice: first it cuts the rate (and goes back to the best epoch), then it stops.

    Replayed by hand on the recorded validation losses: the history's ``lr`` column changes right after
    the first firing, the patience restarts there with the next validation as reference, and the kept
    epoch is the best of the whole run (either stage).
    """
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=16)
    m.train(
        max_epochs=300,
        lr=3e-2,
        seed=1,
        progress_bar=False,
        early_stopping=True,
        early_stopping_patience=6,
        early_stopping_lr_reductions=1,
        early_stopping_lr_factor=0.25,
        check_val_every_n_epoch=2,
    )
    h = m.history
    assert m.training_summary["stopped_early"]
    rule = ConvergenceRule(patience=6, relative_delta=1e-3)
    checked = h.dropna(subset=["loss_validation"])
    fired = []
    for epoch, loss in zip(checked["epoch"], checked["loss_validation"], strict=True):
        if rule.update(int(epoch), float(loss))[1]:
            fired.append(int(epoch))
            rule.restart(int(epoch))
    assert len(fired) == 2 and fired[-1] == len(h)
    lr = h.set_index("epoch")["lr"]
    assert (lr.loc[: fired[0]] == 3e-2).all() and np.allclose(lr.loc[fired[0] + 1 :], 3e-2 * 0.25, rtol=1e-12)
    best = checked.loc[checked["loss_validation"].idxmin()]
    assert m.training_summary["kept_epoch"] == int(best["epoch"]) == rule.best_epoch
    assert _validation_loss(m, seed=1) == pytest.approx(float(best["loss_validation"]), rel=1e-6)


def test_a_cut_goes_back_to_the_best_parameters_and_the_next_firing_stops():
    """``EarlyStopping`` on a hand-made sequence of losses, with the parameters moved between validations.

    Patience 2, delta 0: 5.0 (epoch 1, best), 6.0, 7.0 (epoch 3 fires: back to epoch 1's parameters, rate
    0.5 -> 0.05, fresh patience), 5.5 (epoch 4: the new reference, though worse than the best), 5.2 (counts),
    5.3, 5.25 (epoch 7 fires again: stop). Without the fresh patience epoch 4 or 5 would stop; the kept
    parameters are epoch 1's, the best of both stages.
    """
    layer = torch.nn.Linear(2, 1)
    live = list(layer.state_dict().values())
    optimizer = torch.optim.Adam(layer.parameters(), lr=1.0)
    plan = TrainingPlan(
        early_stopping=True,
        lr=0.5,
        early_stopping_patience=2,
        early_stopping_relative_delta=0.0,
        early_stopping_lr_reductions=1,
        early_stopping_lr_factor=0.1,
    )
    stopping = EarlyStopping(plan, live, optimizer)
    assert optimizer.param_groups[0]["lr"] == 0.5
    weights = {}
    for epoch, loss in enumerate([5.0, 6.0, 7.0, 5.5, 5.2, 5.3, 5.25], start=1):
        with torch.no_grad():
            layer.weight.fill_(float(epoch))  # the parameters of this epoch
        weights[epoch] = layer.weight.clone()
        stop = stopping.update(epoch, loss)
        if epoch == 3:
            assert not stop and torch.equal(layer.weight, weights[1])  # back to the best epoch's parameters
            assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05) == stopping.lr
        else:
            assert stop == (epoch == 7), epoch
    assert stopping.rule.best_epoch == 1 and stopping.restore_best()
    assert torch.equal(layer.weight, weights[1])


def test_early_stopping_is_deterministic(small_adata):
    kwargs = dict(max_epochs=200, lr=3e-2, seed=5, progress_bar=False, early_stopping=True, early_stopping_patience=4)
    a = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(**kwargs)
    b = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(**kwargs)
    assert a.training_summary == b.training_summary
    assert torch.equal(_params(a), _params(b))


def test_no_stopping_during_kl_warmup(small_adata):
    # A delta of 50% never counts after the first check, so without warm-up training stops at epoch 1 + 1.
    kwargs = dict(
        max_epochs=30,
        seed=0,
        progress_bar=False,
        early_stopping=True,
        early_stopping_patience=1,
        early_stopping_relative_delta=0.5,
        early_stopping_lr_reductions=0,
        check_val_every_n_epoch=1,
    )
    plain = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(**kwargs)
    assert plain.training_summary["epochs_trained"] == 2
    warm = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(kl_warmup_epochs=8, **kwargs)
    # the KL weight reaches 1 at epoch 8: the first check that counts, then one more epoch
    assert warm.training_summary["epochs_trained"] == 9
    assert warm.history["kl_weight"].iloc[7] == 1.0 and warm.history["kl_weight"].iloc[6] < 1.0


def test_train_and_diagnose_share_one_stopping_rule(small_adata):
    plan = TrainingPlan(early_stopping=True)
    assert (plan.validation_interval, plan.early_stopping_patience, plan.early_stopping_relative_delta) == (
        DEFAULT_STOPPING.check_val_every_n_epoch,
        DEFAULT_STOPPING.patience,
        DEFAULT_STOPPING.relative_delta,
    )
    assert diagnose_train_kwargs(None, 1000) == {
        "max_epochs": default_epochs(1000),
        **DEFAULT_STOPPING.train_kwargs(),
        "progress_bar": False,
    }
    assert TrainingPlan() == plan and plan.learning_rate == DEFAULT_STOPPING.lr
    assert TrainingPlan(early_stopping=False).learning_rate == 1e-3
    # train() at its defaults stops where diagnose's rule, spelled out, stops.
    kwargs = dict(max_epochs=300, seed=2, progress_bar=False)
    by_default = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(**kwargs)
    explicit = cv.CountVAE(small_adata, n_latent=2, n_hidden=16).train(
        **DIAGNOSE_STOPPING, early_stopping=True, **kwargs
    )
    assert by_default.training_summary["stopped_early"], "the fit should stop before its 300 epochs"
    assert by_default.training_summary == explicit.training_summary
    pd.testing.assert_frame_equal(by_default.history, explicit.history)


def test_validation_every_epoch_without_early_stopping(small_adata):
    assert TrainingPlan(early_stopping=False).validation_interval == 1
    assert TrainingPlan().validation_interval == DEFAULT_STOPPING.check_val_every_n_epoch
    assert TrainingPlan(early_stopping=True, check_val_every_n_epoch=3).validation_interval == 3
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(max_epochs=3, early_stopping=False, progress_bar=False)
    assert m.history["loss_validation"].notna().all()


def test_training_summary_without_stopping_and_after_save(small_adata, tmp_path):
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=16)
    assert m.training_summary == {}
    m.train(max_epochs=3, early_stopping=False, progress_bar=False)
    assert m.training_summary == {
        "epochs_trained": 3,
        "max_epochs": 3,
        "stopped_early": False,
        "kept_epoch": 3,
        "early_stopping": False,
    }
    m.train(max_epochs=2, early_stopping=False, progress_bar=False)
    assert m.training_summary["epochs_trained"] == 5 and m.training_summary["max_epochs"] == 5
    m.save(tmp_path / "m")
    assert cv.CountVAE.load(tmp_path / "m").training_summary == m.training_summary


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"check_val_every_n_epoch": 0}, "check_val_every_n_epoch"),
        ({"early_stopping_relative_delta": -0.1}, "early_stopping_relative_delta"),
        ({"early_stopping_relative_delta": 1.0}, "early_stopping_relative_delta"),
    ],
)
def test_bad_stopping_arguments_are_named(small_adata, kwargs, name):
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=8)
    with pytest.raises(cv.errors.InvalidArgumentError, match=name):
        m.train(progress_bar=False, **kwargs)


def test_a_continued_call_trains_at_its_own_learning_rate(small_adata):
    """A second ``train`` call sets its learning rate on the kept optimiser (it used to keep the first call's)."""
    m = cv.CountVAE(small_adata, n_latent=2, n_hidden=8)
    m.train(max_epochs=2, lr=1e-3, progress_bar=False)
    m.train(max_epochs=1, lr=5e-3, progress_bar=False)
    assert m._optimizer.param_groups[0]["lr"] == 5e-3
    assert m.history["lr"].tolist() == [1e-3, 1e-3, 5e-3]
    m.train(max_epochs=1, progress_bar=False)  # the default again: the shared rule's starting rate
    assert m.history["lr"].iloc[-1] == DEFAULT_STOPPING.lr == m._optimizer.param_groups[0]["lr"]
    m.train(max_epochs=1, early_stopping=False, progress_bar=False)  # scvi-tools' 1e-3 without early stopping
    assert m.history["lr"].iloc[-1] == 1e-3 == m._optimizer.param_groups[0]["lr"]


def test_the_rule_firing_on_the_last_epoch_is_not_stopping_early(small_adata, monkeypatch):
    # stopped_early ("early stopping ended training before max_epochs") read True with every epoch trained.
    from countvae.model import training

    original = training.EarlyStopping.update

    def fires_at_four(self, epoch, loss):
        original(self, epoch, loss)
        return epoch == 4

    monkeypatch.setattr(training.EarlyStopping, "update", fires_at_four)
    kwargs = dict(early_stopping=True, check_val_every_n_epoch=1, progress_bar=False)
    last = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(max_epochs=4, **kwargs).training_summary
    assert last["epochs_trained"] == 4 and last["stopped_early"] is False
    before = cv.CountVAE(small_adata, n_latent=2, n_hidden=8).train(max_epochs=6, **kwargs).training_summary
    assert before["epochs_trained"] == 4 and before["stopped_early"] is True
