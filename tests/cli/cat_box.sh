# cat of a box: rows 0-1, columns 1-2 of model.w (3x4).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.w --offsets 0,1 --sizes 2,2 >out.bin
rc=$?
od -An -tx1 -v out.bin
exit $rc
