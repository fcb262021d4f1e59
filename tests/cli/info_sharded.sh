# dcptool info on a checkpoint PyTorch wrote from two ranks.
cp -R "$DCP_TEST_DATA/torch_sharded" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
