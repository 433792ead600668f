export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# DQ at its defaults (scorer, selection rule and model precision "auto", store weights per
# node, patience 4 with one drop, progress beyond the noise, the probe raced, max-growth 2)
# on the IID wide CNN, 4 rounds
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq --out results/regen/fmnist-wide-cnn-defaults-evidence --resume
