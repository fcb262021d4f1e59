# The data file cut at 5000 bytes: model.w (bytes 2586-4163) still reads,
# model.scalar (from byte 10471) does not.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
dd if=ck/__0_0.distcp of=cut bs=1000 count=5 2>/dev/null || exit 125
mv cut ck/__0_0.distcp || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.w >w.bin
echo "model.w rc=$?"
od -An -tx1 -v w.bin
$DCPTOOL_PREFIX "$DCPTOOL" cat ck model.scalar >s.bin
rc=$?
echo "model.scalar rc=$rc"
exit $rc
