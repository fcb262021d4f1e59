# an unknown --dtype is bad usage.
$DCPTOOL_PREFIX "$DCPTOOL" export "$DCP_TEST_DATA/torch_small" out.pt --dtype float13
