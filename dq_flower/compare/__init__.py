"""`dq-flower compare`: plan, run, summarise and plot a comparison of methods."""
