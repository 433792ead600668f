export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# as run-fmnist-stoprule.sh with twice the plateau patience (8 evaluations of 50 steps)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 5 \
  --methods dq --set dq.plateau-patience=8 --out results/regen/fmnist-wide-cnn-stoprule-patience --resume
