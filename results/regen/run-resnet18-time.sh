export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# The ResNet-18 comparison's time tables at today's DQ: DQ for the two rounds it needs to
# 80%; the competitors' finished runs are reused from the published folder (their code path,
# CompressedUpdates and PowerSGD on the devices, is what produced them). OUT: the output folder.
OUT="${OUT:-results/regen/fmnist-resnet18-time-2026-12-06}"
mkdir -p "$OUT"
[ -f "$OUT/results.json" ] || { cp results/regen/fmnist-resnet18/results.json "$OUT/" &&
  python results/regen/reuse_competitors.py "$OUT/results.json"; }
.venv/bin/dq-flower compare --preset fmnist-resnet18 --engine inprocess \
  --methods dq,fedavg-qsgd2,fedavg-topk,powersgd --set dq.num-server-rounds=2 \
  --out "$OUT" --resume \
  --device measured --device mcu --device rpi4 --device phone --server-device gpu \
  --link lte --link wifi --link datacenter --link nbiot --link lorawan --link iridium "$@"
