"""Train an MLP on scikit-learn's digits with data quantization, in Flower's simulation engine."""

import dq_flower

result = dq_flower.simulate(
    method="dq", dataset="digits", model="mlp", num_clients=4, rounds=5, seed=0,
    budget=64, bits=2,
)
print(f"model D={result.num_params} parameters, data d={result.data_dim}")
print("round  accuracy  up bytes  down bytes  cum up bytes")
for row in result.history:
    print(f"{row['round']:>5}  {row['accuracy']:8.3f}  {row['up_bytes']:8d}  "
          f"{row['down_bytes']:10d}  {row['cum_up_bytes']:12d}")
