"""The log joint of an scvi-tools ``VAE``/``LDVAE`` module, in the form countvae's estimators take.

countvae's ``log p(x)`` estimators take a callable ``u (..., cells, D) -> log p(x, u) (..., cells)``, whose latent
``u`` has a standard normal prior, and the amortized guide's per-cell location and scale. :class:`SCVICells` builds
both for one minibatch from the scvi module's own pieces: ``module.generative`` gives the likelihood ``px`` (Poisson,
NB or ZINB, with the module's dispersion and covariates), ``module.inference`` the guide.

* With an observed library size (``use_observed_lib_size=True``, SCVI's default) ``u = z`` (``D = n_latent``) and the
  log library is the cell's observed ``log sum_g x_g``, as scvi-tools uses it: the estimate is
  ``log p(x | observed library size)``.
* With a latent library size (LinearSCVI's default), the log library ``l`` has scvi's per-batch prior
  ``N(m_b, s_b^2)`` and is added as one more coordinate, standardised: ``u = (z, (l - m_b) / s_b)`` has a ``N(0, I)``
  prior in ``D = n_latent + 1`` dimensions (the change of variables leaves the integral unchanged), and the estimate
  is ``log p(x)`` with the library integrated out, as scvi-tools' ``get_marginal_ll`` estimates.

The log joint is evaluated in float64 on a copy of the module (:func:`float64_copy`): scvi-tools' float32 rounds a
cell's log-likelihood by about 1e-5 of it (measured: 0.07 nats on a cell at -6,650 nats), the order of the accuracy
the estimate is meant to have. scvi-tools is not imported: the module brings its own distribution classes.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import torch

from countvae.diagnostics.fitting.lpd_quantity import GIVEN_OBSERVED_LIBRARY, LIBRARY_INTEGRATED
from countvae.errors import InvalidArgumentError

#: scvi-tools' count likelihoods (``gene_likelihood``) the log joint covers.
COUNT_LIKELIHOODS = ("poisson", "nb", "zinb")


def unsupported_module_reason(module: Any) -> str | None:
    """Why :class:`SCVICells` cannot build the log joint of ``module``, or ``None`` when it can.

    Extra covariates are not visible on the module (scvi-tools' ``VAE`` does not keep their sizes): :class:`SCVIFit`
    refuses such models from their registry.
    """
    if getattr(module, "latent_distribution", "normal") != "normal":
        return f"latent_distribution={module.latent_distribution!r}; the log joint needs the normal latent."
    if getattr(module, "gene_likelihood", None) not in COUNT_LIKELIHOODS:
        return f"gene_likelihood={getattr(module, 'gene_likelihood', None)!r} is not 'poisson', 'nb' or 'zinb'."
    if getattr(module, "use_size_factor_key", False):
        return "the model was set up with size_factor_key; its library size is an external size factor."
    if getattr(module, "batch_representation", "one-hot") != "one-hot":
        return f"batch_representation={module.batch_representation!r}; only one-hot batches are supported."
    return None


def float64_copy(module: Any) -> Any:
    """A float64 copy of an scvi-tools ``VAE`` module, in eval mode (the float32 weights are exact in float64).

    The per-batch library prior and a batch- or label-dependent dispersion stay float32, as the model's values:
    scvi-tools multiplies them by a one-hot matrix it casts to float32 (``VAE._compute_local_library_params``,
    ``VAE.generative``), and the products are promoted to float64 where they meet the rest.
    """
    out = copy.deepcopy(module).double().eval()
    for name in ("library_log_means", "library_log_vars"):
        if getattr(out, name, None) is not None:
            setattr(out, name, getattr(out, name).float())
    if getattr(out, "dispersion", "gene") in ("gene-batch", "gene-label"):
        out.px_r = torch.nn.Parameter(out.px_r.detach().float(), requires_grad=False)
    for parameter in out.parameters():
        parameter.requires_grad_(False)
    return out


def _standard_normal_log_prob(u: torch.Tensor) -> torch.Tensor:
    """``log N(u; 0, I)`` summed over the last axis."""
    return -0.5 * (u**2).sum(-1) - 0.5 * u.shape[-1] * math.log(2 * math.pi)


@dataclass(frozen=True)
class SCVICells:
    """The log joint and the guide of an scvi-tools module for one minibatch of cells.

    Build it with :meth:`from_tensors`. Calling it evaluates ``log p(x, u)``.

    Attributes
    ----------
    module
        The scvi-tools ``VAE``/``LDVAE`` module, in eval mode (float64: see :func:`float64_copy`).
    x
        Counts (cells, genes), float64.
    batch, labels
        Batch and label codes (cells, 1), as scvi's data loader gives them.
    library_loc, library_scale
        Prior mean and standard deviation of each cell's log library size (cells, 1); ``None`` with the observed one.

    """

    module: Any
    x: torch.Tensor
    batch: torch.Tensor
    labels: torch.Tensor
    library_loc: torch.Tensor | None
    library_scale: torch.Tensor | None

    @classmethod
    def from_tensors(cls, module: Any, tensors: dict[str, torch.Tensor]) -> SCVICells:
        """From one minibatch of scvi-tools' data loader (keys ``X``, ``batch``, ``labels``).

        Raises
        ------
        InvalidArgumentError
            If the module's model is not one this log joint covers (see :func:`unsupported_module_reason`).

        """
        reason = unsupported_module_reason(module)
        if reason is not None:
            raise InvalidArgumentError(f"Cannot evaluate this scvi-tools model's log p(x): {reason}")
        module.eval()
        x = tensors["X"].to(torch.float64)
        if next(module.decoder.parameters()).dtype != torch.float64:
            raise InvalidArgumentError("Pass float64_copy(module): the log joint is evaluated in float64.")
        batch = tensors["batch"].long()
        loc = scale = None
        if not module.use_observed_lib_size:
            codes = batch.squeeze(-1)
            loc = module.library_log_means[0, codes].to(torch.float64).unsqueeze(-1)
            scale = module.library_log_vars[0, codes].to(torch.float64).sqrt().unsqueeze(-1)
        return cls(module, x, batch, tensors["labels"].long(), loc, scale)

    def take(self, rows: torch.Tensor) -> SCVICells:
        """The cells at positions ``rows``."""
        loc = None if self.library_loc is None else self.library_loc[rows]
        scale = None if self.library_scale is None else self.library_scale[rows]
        return SCVICells(self.module, self.x[rows], self.batch[rows], self.labels[rows], loc, scale)

    def log_joint(self, u: torch.Tensor, cells: torch.Tensor) -> torch.Tensor:
        """``log p(x_c, u)`` (..., m) for the cells at positions ``cells`` (m,), at ``u`` (..., m, D).

        The form :func:`countvae.module.marginal.estimate_log_marginal` calls.
        """
        return self.take(cells)(u)

    @property
    def n_latent(self) -> int:
        """Dimension ``D`` of ``u``: ``n_latent``, plus one for a latent library size."""
        return int(self.module.n_latent) + (self.library_loc is not None)

    @property
    def quantity(self) -> str:
        """Which ``log p(x)`` this joint integrates to (see :mod:`.lpd_quantity`)."""
        return GIVEN_OBSERVED_LIBRARY if self.library_loc is None else LIBRARY_INTEGRATED

    def split(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``z`` (..., cells, n_latent) and the log library (..., cells, 1) at ``u`` (..., cells, D)."""
        if u.shape[-2:] != (self.x.shape[0], self.n_latent):
            raise InvalidArgumentError(
                f"u must have shape (..., {self.x.shape[0]}, {self.n_latent}) for these cells; got {tuple(u.shape)}."
            )
        if self.library_loc is None:
            return u, torch.log(self.x.sum(-1, keepdim=True)).expand(*u.shape[:-1], 1)
        return u[..., :-1], self.library_loc + self.library_scale * u[..., -1:]

    def log_likelihood(self, u: torch.Tensor) -> torch.Tensor:
        """``log p(x | z, l)`` per cell (..., cells), from ``module.generative`` at ``u``."""
        z, library = self.split(u)
        flat_z = z.reshape(-1, *z.shape[-2:])
        flat_l = library.reshape(-1, *library.shape[-2:])
        if flat_z.shape[0] == 1:  # scvi's decoder takes (cells, L) or (samples, cells, L)
            flat_z, flat_l = flat_z[0], flat_l[0]
        px = self.module.generative(z=flat_z, library=flat_l, batch_index=self.batch, y=self.labels)["px"]
        return px.log_prob(self.x).sum(-1).reshape(u.shape[:-1])

    def __call__(self, u: torch.Tensor) -> torch.Tensor:
        """``log p(x | z, l) + log N(u; 0, I)`` per cell (..., cells), nats, float64."""
        u = u.to(torch.float64)
        return self.log_likelihood(u) + _standard_normal_log_prob(u)

    @torch.no_grad()
    def guide(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Location and scale (cells, D) of the amortized guide ``q(u | x)``, float64.

        ``q(z | x)`` from ``module.inference``; with a latent library, ``q(l | x)``
        standardised like ``u``'s last coordinate.
        """
        out = self.module.inference(x=self.x, batch_index=self.batch)
        loc, scale = out["qz"].loc.to(torch.float64), out["qz"].scale.to(torch.float64)
        if self.library_loc is not None:
            ql = out["ql"]
            loc = torch.cat([loc, (ql.loc.to(torch.float64) - self.library_loc) / self.library_scale], dim=-1)
            scale = torch.cat([scale, ql.scale.to(torch.float64) / self.library_scale], dim=-1)
        return loc, scale
