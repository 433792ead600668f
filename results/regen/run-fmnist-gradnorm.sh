export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd /work/main
# DQ on the IID wide CNN with the gradnorm scorer (sampled, scoring model sent at fp16), current code
.venv/bin/dq-flower compare --preset results/regen/fmnist-wide-cnn.toml --engine inprocess --rounds 7 \
  --methods dq --set dq.num-server-rounds=7 --set dq.scorer=gradnorm --set dq.selection-rule=sample \
  --set dq.model-precision=fp16 --out results/regen/fmnist-wide-cnn-gradnorm --resume
