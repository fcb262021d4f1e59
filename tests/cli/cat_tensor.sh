# cat of a whole float32 tensor: raw little-endian bytes.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.w >out.bin
rc=$?
od -An -tx1 -v out.bin
exit $rc
