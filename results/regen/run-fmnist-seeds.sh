export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# More seeds of the two candidate knob sets on the IID wide CNN (3 rounds each), every
# knob spelled out: patience 8 + max-growth 2 with the entropy scorer (sampled, fp16
# model), and with the uniform scorer
for seed in 1 2; do
  .venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 3 --seed $seed \
    --methods dq --set dq.plateau-patience=8 --set dq.max-growth=2.0 --set dq.scorer=entropy \
    --set dq.selection-rule=sample --set dq.model-precision=fp16 \
    --out results/regen/fmnist-wide-cnn-g2e-seed$seed --resume
  .venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 3 --seed $seed \
    --methods dq --set dq.plateau-patience=8 --set dq.max-growth=2.0 --set dq.scorer=uniform \
    --set dq.selection-rule=topk --set dq.model-precision=fp32 \
    --out results/regen/fmnist-wide-cnn-g2-seed$seed --resume
done
