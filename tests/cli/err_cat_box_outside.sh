# cat of a box that reaches outside the tensor (3x4).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.w --offsets 2,3 --sizes 2,2
