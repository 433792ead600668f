"""DQ's server side: the strategy, reply intake and checks, the store, training, schedule."""
