# The Dirichlet(0.1) table's fedavg-* rows through CompressedUpdates(FedAvg), one method a
# call (15 rounds each):
#   bash run-fmnist-dirichlet-fedavg.sh METHOD
# One at a time: the inprocess engine gives each client every core (num-threads), so two
# runs at once on 2 cores oversubscribe them (measured: 370 s a round each, against about
# 85 s a round alone). Then merge_runs.py into results/regen/fmnist-wide-cnn-dirichlet.
export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
m="$1"
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn-dirichlet.toml --engine inprocess --rounds 15 \
  --methods "$m" --set "$m.num-server-rounds=15" --set "$m.eval-every=1" \
  --out "results/regen/fmnist-wide-cnn-dirichlet-$m" --resume
