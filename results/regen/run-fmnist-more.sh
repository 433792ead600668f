export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
# the IID table's fedavg-* rows through CompressedUpdates(FedAvg), beside dq. Every method
# here is reused with --resume; the runs were made by this command's earlier versions and
# by run-fmnist-rest-a.sh (fedavg-ef-sign, fedavg-fp16) and run-fmnist-rest-b.sh
# (fedavg-fp32), merged with merge_runs.py.
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn.toml --engine inprocess --rounds 12 \
  --methods dq,fedavg-qsgd2,fedavg-topk,fedavg-qsgd4,fedavg-ef-sign,fedavg-fp16,fedavg-fp32 --set dq.num-server-rounds=12 \
  --set fedavg-qsgd2.num-server-rounds=5 --set fedavg-qsgd2.eval-every=1 \
  --set fedavg-topk.num-server-rounds=8 --set fedavg-topk.eval-every=1 \
  --set fedavg-qsgd4.num-server-rounds=6 --set fedavg-qsgd4.eval-every=1 \
  --set fedavg-ef-sign.num-server-rounds=8 --set fedavg-ef-sign.eval-every=1 \
  --set fedavg-fp16.num-server-rounds=6 --set fedavg-fp16.eval-every=1 \
  --set fedavg-fp32.num-server-rounds=6 --set fedavg-fp32.eval-every=1 \
  --out results/regen/fmnist-wide-cnn-more --resume
