# info --json: the summary as one object.
cd "$DCP_TEST_DATA" || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info --json torch_sharded
