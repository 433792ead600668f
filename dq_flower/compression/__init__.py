"""Compressed model updates for any Flower strategy: a strategy wrapper and its client mod.

:class:`dq_flower.compression.strategy.CompressedUpdates` wraps a Flower strategy
(``FedAvg``, ``FedProx``, ``FedAdam``, ...) and :func:`dq_flower.compression.mod.compression_mod`
is its client mod, the pattern of Flower's own ``DifferentialPrivacyClientSideFixedClipping``
and ``fixedclipping_mod``: the user's ``@app.train()`` runs unchanged, the mod codes the
update it returns, and the wrapper screens and decodes every reply back into weights before
the inner strategy aggregates. :mod:`dq_flower.wire.compressed_update` is what both ends share.
"""
