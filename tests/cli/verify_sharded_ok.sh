# dcptool verify on an intact two-rank checkpoint (5 records in 2 files).
cp -R "$DCP_TEST_DATA/torch_sharded" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" verify ck
