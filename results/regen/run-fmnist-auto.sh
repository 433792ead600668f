export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# The IID wide CNN with scorer, selection rule and model precision "auto" (entropy and
# sampling on the nodes that hold the model, the model at int8), the store's rows weighted
# per node, patience 8 and max-growth 2 (3 rounds), seeds given as arguments
for seed in "$@"; do
  .venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 3 --seed $seed \
    --methods dq --set dq.plateau-patience=8 --set dq.max-growth=2.0 --set dq.scorer=auto \
    --set dq.selection-rule=auto --set dq.model-precision=auto --set dq.store-weights=node \
    --out results/regen/fmnist-wide-cnn-auto-seed$seed --resume
done
