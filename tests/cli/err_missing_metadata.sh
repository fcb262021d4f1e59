# A directory with a data file but no .metadata.
mkdir ck && cp "$DCP_TEST_DATA/torch_small/__0_0.distcp" ck/ || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
