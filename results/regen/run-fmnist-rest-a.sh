export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
# IID fedavg-ef-sign and fedavg-fp16 through CompressedUpdates(FedAvg); merged into fmnist-wide-cnn-more afterwards
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn.toml --engine inprocess --rounds 12 \
  --methods fedavg-ef-sign,fedavg-fp16 \
  --set fedavg-ef-sign.num-server-rounds=8 --set fedavg-ef-sign.eval-every=1 \
  --set fedavg-fp16.num-server-rounds=6 --set fedavg-fp16.eval-every=1 \
  --out results/regen/fmnist-wide-cnn-rest-a --resume
