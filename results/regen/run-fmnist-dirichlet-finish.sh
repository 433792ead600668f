# Every Dirichlet(0.1) fedavg-* row through CompressedUpdates(FedAvg), then the one table,
# published into docs/results/fmnist-wide-cnn-dirichlet-current/. One method at a time
# (an in-process run uses every core); a method already run is reused (--resume), so this
# only runs what is missing (about 23 minutes a method on a free 2-core machine).
#   bash results/regen/run-fmnist-dirichlet-finish.sh
set -e
cd /work/main
methods=(fedavg-qsgd2 fedavg-qsgd4 fedavg-ef-sign fedavg-topk fedavg-fp16 fedavg-fp32)
for m in "${methods[@]}"; do
  bash results/regen/run-fmnist-dirichlet-fedavg.sh "$m"
  .venv/bin/python results/regen/merge_runs.py results/regen/fmnist-wide-cnn-dirichlet \
    "results/regen/fmnist-wide-cnn-dirichlet-$m"
done
all="dq$(printf ',%s' "${methods[@]}")"
bash results/regen/run-fmnist-dirichlet-merged.sh "$all"
cp results/regen/fmnist-wide-cnn-dirichlet/{summary.md,accuracy_vs_rounds.png,accuracy_vs_uplink.png} \
  docs/results/fmnist-wide-cnn-dirichlet-current/
