"""The data-quantization method: strategy, client function, store, selection, planner."""
