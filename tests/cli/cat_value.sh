# cat of a value: JSON and a newline. info is
# ("tiny", 0.5, True, None, b"\x00\xff", [1, 2]).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck info
