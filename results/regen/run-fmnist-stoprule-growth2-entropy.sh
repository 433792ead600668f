export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# as run-fmnist-stoprule-growth2.sh, with later uploads drawn by the predictive entropy of
# the server's model (sent at fp16 to the nodes asked)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 3 \
  --methods dq --set dq.plateau-patience=8 --set dq.max-growth=2.0 --set dq.scorer=entropy \
  --set dq.selection-rule=sample --set dq.model-precision=fp16 \
  --out results/regen/fmnist-wide-cnn-stoprule-growth2-entropy --resume
