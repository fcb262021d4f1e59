# diff with a directory that holds no checkpoint: trouble, exit 2.
$DCPTOOL_PREFIX "$DCPTOOL" diff "$DCP_TEST_DATA/torch_small" nowhere
