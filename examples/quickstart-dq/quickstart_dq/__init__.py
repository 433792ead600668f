"""quickstart_dq: a Flower / PyTorch app trained with data quantization (dq-flower)."""
