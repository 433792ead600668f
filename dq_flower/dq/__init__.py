"""The data-quantization method: server side, node side and the knobs both share.

``server/``: the strategy, reply intake and checks, the store, training and schedule;
``client/``: the node's round (selection, scoring, coding); ``config``: the knobs.
"""
