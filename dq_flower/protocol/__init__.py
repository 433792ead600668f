"""Wire formats both ends import: DQ sample batches, gradient updates, model records."""
