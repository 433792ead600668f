export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# DQ at its defaults on the IID wide CNN with the evidence-based stop rule, the first ask
# sized for the held-out rows and image shifts on the server (8 rounds)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 8 \
  --methods dq --out results/regen/fmnist-wide-cnn-stoprule --resume
