export OMP_NUM_THREADS=1 FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
cd "$(dirname "$0")/../.."
# upload-all and upload-all-8bit on the ResNet-18 preset (5,000 rows, 5 IID clients), with
# the published table's devices and links; the server's optimizer fixed to SGD at lr 0.05,
# as in the published DQ row (which predates the optimizer chosen on held-out rows)
.venv/bin/dq-flower compare --preset fmnist-resnet18 --engine inprocess \
  --methods upload-all,upload-all-8bit \
  --set upload-all.optimizer=sgd --set upload-all-8bit.optimizer=sgd \
  --device measured --device mcu --device rpi4 --device phone --server-device gpu \
  --link lte --link wifi --link datacenter --link nbiot --link lorawan --link iridium \
  --out results/regen/fmnist-resnet18-upload-all --resume --verbose
