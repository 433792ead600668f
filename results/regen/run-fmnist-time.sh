export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# Time to 85% at today's code: DQ at its defaults beside fedavg-qsgd2 (Flower's FedAvg with a
# 2-bit QSGD update in CompressedUpdates, its tuned client-lr 0.1 being the default), on the
# IID wide CNN, 4 rounds each, compute in CPU seconds (process time)
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq,fedavg-qsgd2 --out results/regen/fmnist-wide-cnn-time --resume \
  --link lte --link wifi --link datacenter \
  --device measured --device rpi4 --device phone --device laptop-core
