export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
# the IID table's other fedavg-* rows through CompressedUpdates(FedAvg), beside the reused dq and fedavg-qsgd2
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn.toml --engine inprocess --rounds 12 \
  --methods dq,fedavg-qsgd2,fedavg-topk,fedavg-qsgd4 --set dq.num-server-rounds=12 \
  --set fedavg-qsgd2.num-server-rounds=5 --set fedavg-qsgd2.eval-every=1 \
  --set fedavg-topk.num-server-rounds=8 --set fedavg-topk.eval-every=1 \
  --set fedavg-qsgd4.num-server-rounds=6 --set fedavg-qsgd4.eval-every=1 \
  --out results/regen/fmnist-wide-cnn-more --resume
