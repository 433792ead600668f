"""Wire formats both ends import, every encode/decode pair and no policy.

DQ sample batches and their data spec, held-out tables, gradient updates and their replies,
compressed model updates, model records and node configuration errors. Nothing here imports
a method (``dq_flower.dq``, ``dq_flower.baselines``, ``dq_flower.compression``) or a config
class: what to send is the methods' choice, how it looks on the wire is this layer's.
"""
