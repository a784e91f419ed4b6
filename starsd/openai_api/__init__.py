"""The target's OpenAI-compatible HTTP front-end: it converts HTTP requests into engine calls and the engine's
results into OpenAI's responses (as ``starsd.draft.servicer`` converts gRPC for the draft). The engine itself,
``starsd.verifier``, knows nothing of HTTP."""
