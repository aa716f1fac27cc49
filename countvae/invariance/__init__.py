"""Orthogonal reparameterizations of a fitted model and the proof that p(x) is unchanged."""

from countvae.invariance.quadrature import log_marginal_linear, quadrature_log_marginal

__all__ = ["log_marginal_linear", "quadrature_log_marginal"]
