"""DQ's node side: :func:`dq_flower.dq.client.train.dq_train` and what it calls."""
