# dcptool ls on a two-rank checkpoint: x and y are stored as 2 chunks each.
cp -R "$DCP_TEST_DATA/torch_sharded" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" ls ck
