export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# DQ at its defaults (the evidence-based stop rule) on the Dirichlet(0.1) wide CNN, 6 rounds
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn-dirichlet.toml --engine inprocess \
  --rounds 6 --methods dq --out results/regen/fmnist-wide-cnn-dirichlet-stoprule --resume
