"""Test-only helpers that the product does not need: the fault-injection proxy and the lossless-check oracle.

They live under tests/ so that the package the images install (``starsd``) carries none of them.
"""
