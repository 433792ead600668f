export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# The wide CNN's time tables at today's DQ: DQ for the two rounds it needs to 85%;
# fedavg-qsgd2's finished run is reused from results/regen/fmnist-wide-cnn-time-2026-12-06b
# (run-fmnist-time-quiet.sh at commit 2e020c3). OUT: the output folder; further arguments
# go to compare. Run with nothing else on the machine: the tables use CPU seconds.
OUT="${OUT:-results/regen/fmnist-wide-cnn-time-2026-12-06c}"
mkdir -p "$OUT"
[ -f "$OUT/results.json" ] || { cp results/regen/fmnist-wide-cnn-time-2026-12-06b/results.json "$OUT/" &&
  python results/regen/reuse_competitors.py "$OUT/results.json"; }
.venv/bin/dq-flower compare --preset fmnist-wide-cnn --engine inprocess --rounds 4 \
  --methods dq,fedavg-qsgd2 --set dq.num-server-rounds=2 \
  --out "$OUT" --resume \
  --link lte --link wifi --link datacenter \
  --device measured --device rpi4 --device phone --device laptop-core "$@"
