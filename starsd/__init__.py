"""StarSD: one-for-many speculative decoding (one draft model, many target models, star topology)."""

__version__ = "0.1.0"
