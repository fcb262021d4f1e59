# info takes one directory.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck ck
