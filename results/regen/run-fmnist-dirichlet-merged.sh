# The Dirichlet(0.1) table at the current code: dq (run-fmnist-dirichlet.sh) beside the
# fedavg-* rows through CompressedUpdates(FedAvg) (run-fmnist-dirichlet-fedavg.sh METHOD,
# 15 rounds each), every run reused with --resume after merge_runs.py put them in one
# folder:
#   python results/regen/merge_runs.py results/regen/fmnist-wide-cnn-dirichlet \
#     results/regen/fmnist-wide-cnn-dirichlet-fedavg-qsgd2 ...
#   bash results/regen/run-fmnist-dirichlet-merged.sh dq,fedavg-qsgd2,...
# A method whose run is not in the folder would run here (15 rounds): list only merged ones.
export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
methods="$1"
sets=(--set dq.num-server-rounds=12)
for m in ${methods//,/ }; do
  [ "$m" = dq ] || sets+=(--set "$m.num-server-rounds=15" --set "$m.eval-every=1")
done
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn-dirichlet.toml --engine inprocess --rounds 12 \
  --methods "$methods" "${sets[@]}" --out results/regen/fmnist-wide-cnn-dirichlet --resume
