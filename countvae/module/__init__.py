"""Pyro count VAE: priors, decoders, likelihoods, encoder, model and guide, losses."""

from countvae.module.decoders import DecoderOutput, LinearDecoder, MLPDecoder
from countvae.module.encoder import GaussianEncoder
from countvae.module.likelihoods import CountLikelihood
from countvae.module.loss import minibatch_loss, per_cell_elbo
from countvae.module.priors import LatentPrior
from countvae.module.vae import CountVAEModule

__all__ = [
    "CountLikelihood",
    "CountVAEModule",
    "DecoderOutput",
    "GaussianEncoder",
    "LatentPrior",
    "LinearDecoder",
    "MLPDecoder",
    "minibatch_loss",
    "per_cell_elbo",
]
