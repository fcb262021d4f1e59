# dcptool ls: one line per entry, sorted by key, tab-separated:
# key, dtype ("value" for non-tensors), global shape, chunks, bytes.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" ls ck
