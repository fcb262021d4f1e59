# dcptool info on a PyTorch-written checkpoint (tests/data/torch_small).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
