export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn-dirichlet.toml --engine inprocess --rounds 12 \
  --methods dq --set dq.num-server-rounds=12 \
  --out results/regen/fmnist-wide-cnn-dirichlet --resume
