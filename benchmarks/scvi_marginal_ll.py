"""scvi-tools' own held-out ``log p(x)`` estimate (``get_marginal_ll``) of an ``SCVIFit``, with its diagnostics.

The reference against which tests show that countvae's estimator
(``SCVIFit.log_predictive_density``) is right where scvi-tools' guide-only
importance sampling is far too low; not part of the package.
"""

from __future__ import annotations

import anndata as ad
import pandas as pd
import torch
from torch.distributions import Normal

from countvae.diagnostics import SCVIFit
from countvae.diagnostics.fitting.lpd_quantity import with_quantity
from countvae.errors import InvalidArgumentError
from countvae.module.importance import ImportanceSummary, summarize_log_weights

#: Elements (samples x cells x genes) per forward pass.
_ELEMENTS_PER_PASS = 1 << 22


@torch.no_grad()
def scvi_marginal_ll(
    fit: SCVIFit, adata: ad.AnnData, n_samples: int, seed: int, samples_per_pass: int | None = None
) -> pd.DataFrame:
    """scvi-tools' own estimate of per-cell ``log p(x)`` (``get_marginal_ll``), with its diagnostics.

    Importance sampling with the amortized guide as the proposal, as
    ``get_marginal_ll`` does it and with the same values; far below the truth
    where the guide is poor (see ``SCVIFit.log_predictive_density``), which the
    ``khat`` and ``reliable`` columns show.

    The log weights are those of scvi-tools' ``VAE.marginal_ll``:
    ``log p(x | z, l) + log p(z) - log q(z | x)``, plus
    ``log p(l) - log q(l | x)`` when the library size is latent (LinearSCVI's
    default). ``mc_se``, ``ess`` and ``khat`` are those of
    :func:`countvae.module.importance.summarize_log_weights`. Torch's global
    generator is seeded with ``seed`` inside a forked random state.
    ``samples_per_pass`` is the Monte Carlo samples per forward pass (default:
    as many as fit in about 4M elements).

    Returns
    -------
    pandas.DataFrame
        Columns ``lpd`` (nats, higher is better), ``mc_se`` (NaN where not reliable), ``ess``,
        ``khat`` and ``reliable``, indexed by cell; ``attrs["quantity"]`` is the fit's ``lpd_quantity``.

    """
    if n_samples < 2:
        raise InvalidArgumentError("n_samples must be at least 2 to estimate a Monte Carlo standard error.")
    prepared = fit._prepared(adata)
    module = fit.model.module
    module.eval()
    per_pass = samples_per_pass or max(1, min(n_samples, _ELEMENTS_PER_PASS // (fit.batch_size * len(fit.var_names))))
    parts = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for tensors in fit._loader(prepared):
            x = tensors["X"]
            log_w = []
            for start in range(0, n_samples, per_pass):
                k = min(per_pass, n_samples - start)
                inference, generative = module.forward(
                    tensors,
                    inference_kwargs={"n_samples": k},
                    get_inference_input_kwargs={"full_forward_pass": True},
                    compute_loss=False,
                )
                qz, z = inference["qz"], inference["z"]
                w = (
                    generative["px"].log_prob(x).sum(-1)
                    + Normal(torch.zeros_like(qz.loc), torch.ones_like(qz.scale)).log_prob(z).sum(-1)
                    - qz.log_prob(z).sum(-1)
                )
                if not module.use_observed_lib_size:
                    means, variances = module._compute_local_library_params(tensors["batch"])
                    library = inference["library"]
                    w = w + (
                        Normal(means, variances.sqrt()).log_prob(library).sum(-1)
                        - inference["ql"].log_prob(library).sum(-1)
                    )
                log_w.append(w.reshape(k, -1))
            parts.append(summarize_log_weights(torch.cat(log_w, dim=0)))
    frame = ImportanceSummary.concatenate(parts).to_frame(index=adata.obs_names)
    return with_quantity(frame, fit.lpd_quantity)
