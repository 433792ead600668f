export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# DQ at its defaults beside upload-all (every row uploaded once at DQ's 2 bits and coder)
# and upload-all-8bit, on the IID wide CNN, the scenario of DQ's defaults table (4 rounds)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq,upload-all,upload-all-8bit --out results/regen/fmnist-wide-cnn-upload-all \
  --resume --verbose
