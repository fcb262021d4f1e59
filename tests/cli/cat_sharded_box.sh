# cat of a box spanning both stored chunks of x (rows 2-3 of a 6x4 tensor
# saved as rows 0-2 and 3-5).
cp -R "$DCP_TEST_DATA/torch_sharded" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck x --offsets 2,1 --sizes 2,3 >out.bin
rc=$?
od -An -tx1 -v out.bin
exit $rc
