"""Client-side handlers, one module per method family."""
