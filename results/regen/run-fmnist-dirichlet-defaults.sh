export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# DQ at its defaults (as run-fmnist-defaults.sh) on the Dirichlet(0.1) wide CNN, 5 rounds
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn-dirichlet.toml --engine inprocess \
  --rounds 5 --methods dq --out results/regen/fmnist-wide-cnn-dirichlet-defaults --resume
