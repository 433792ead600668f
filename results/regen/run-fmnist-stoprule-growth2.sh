export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# as run-fmnist-stoprule-patience.sh with the store allowed to double per round (max-growth 2)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq --set dq.plateau-patience=8 --set dq.max-growth=2.0 \
  --out results/regen/fmnist-wide-cnn-stoprule-growth2 --resume
