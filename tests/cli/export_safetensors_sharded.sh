# a sharded safetensors export of a checkpoint torch saved from 2 ranks:
# shards, the index, and the import of the index.
$DCPTOOL_PREFIX "$DCPTOOL" export "$DCP_TEST_DATA/torch_sharded" model.safetensors --max-shard-size 100 --quiet || exit 1
ls
cat model.safetensors.index.json
$DCPTOOL_PREFIX "$DCPTOOL" import model.safetensors.index.json back || exit 1
$DCPTOOL_PREFIX "$DCPTOOL" cat back y | od -An -tx1 -v | head -2
