# ls --json: one object per entry.
$DCPTOOL_PREFIX "$DCPTOOL" ls "$DCP_TEST_DATA/torch_mixed" --json
