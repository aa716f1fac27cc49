"""The user-facing model class and the functions it delegates to."""

from countvae.model.countvae import CountVAE

__all__ = ["CountVAE"]
