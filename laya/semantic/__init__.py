"""The semantic stages' machinery: an embedder, a vector index, and the checks that tell a paraphrase from a
request that means something else.

The router imports this package only when its configuration turns a semantic stage on (rule ``examples``, or a
model with ``semantic_cache``); it needs the ``[semantic]`` extra (numpy, wordllama).
"""
