"""Compressed model updates for any Flower strategy: a strategy wrapper and its client mod.

:class:`~dq_flower.compression.strategy.CompressedUpdates` wraps the strategy and
:func:`~dq_flower.compression.mod.compression_mod` codes the update the user's ``train()``
returns; :mod:`dq_flower.wire.compressed_update` is what both ends share.
"""
