# --dtype bf16 casts the float tensors (int32 "y" is kept), --keys selects,
# --strip-prefix renames.
$DCPTOOL_PREFIX "$DCPTOOL" export "$DCP_TEST_DATA/torch_small" out.safetensors --dtype bf16 --keys 'model.*' --strip-prefix model. || exit 1
$DCPTOOL_PREFIX "$DCPTOOL" import out.safetensors back || exit 1
$DCPTOOL_PREFIX "$DCPTOOL" ls back
