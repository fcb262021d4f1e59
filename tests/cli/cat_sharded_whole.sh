# cat of a whole tensor saved as two column chunks (Shard(1)).
cp -R "$DCP_TEST_DATA/torch_sharded" ck || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck y >out.bin
rc=$?
od -An -tx1 -v out.bin
exit $rc
