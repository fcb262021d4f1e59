# cat of a key the checkpoint does not have.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.nosuch
