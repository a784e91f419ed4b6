"""Training the shipped model pair: a tokenizer, a target language model and a draft distilled from it.

Everything here runs on CPU from text present on every machine (the Python standard library's sources), with
fixed seeds and a fixed data order, so ``starsd models train`` rebuilds the same checkpoints. Modules:

* :mod:`.corpus`: which files are read, and the held-out split used for evaluation.
* :mod:`.tokenizer`: byte-level BPE trained with ``tokenizers``, saved as a ``transformers`` fast tokenizer.
* :mod:`.configs`: the target and draft architectures (Llama, float32, tied embeddings).
* :mod:`.data`: token streams and deterministic batches of windows.
* :mod:`.loop`: the language-model loop (target) and the distillation loop (draft).
* :mod:`.acceptance`: greedy speculative rounds, simulated, to measure how often the draft is accepted.
* :mod:`.pipeline`: the whole recipe, end to end, and the report written next to the checkpoints.
"""
