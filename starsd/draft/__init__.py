"""The draft server: one small model proposing tokens for many targets (the centre of the star)."""
