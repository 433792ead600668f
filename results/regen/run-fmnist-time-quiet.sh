export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# The same comparison as run-fmnist-time.sh, run with nothing else on the machine: DQ for the
# two rounds it needs to 85%, fedavg-qsgd2 for its four (OUT: the output folder; further arguments go to compare)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq,fedavg-qsgd2 --set dq.num-server-rounds=2 \
  --out "${OUT:-results/regen/fmnist-wide-cnn-time-2026-12-06b}" --resume \
  --link lte --link wifi --link datacenter \
  --device measured --device rpi4 --device phone --device laptop-core "$@"
