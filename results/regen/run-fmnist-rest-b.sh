export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
# IID fedavg-fp32 through CompressedUpdates(FedAvg); merged into fmnist-wide-cnn-more afterwards
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn.toml --engine inprocess --rounds 12 \
  --methods fedavg-fp32 \
  --set fedavg-fp32.num-server-rounds=6 --set fedavg-fp32.eval-every=1 \
  --out results/regen/fmnist-wide-cnn-rest-b --resume
