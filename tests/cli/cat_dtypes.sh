# cat of bfloat16, float8_e4m3fn, int64, bool, a 0-d float64 and an empty
# float16 tensor.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
status=0
for k in model.b model.f8 model.ids model.mask model.scalar model.empty; do
    $DCPTOOL_PREFIX "$DCPTOOL" cat ck "$k" >out.bin
    rc=$?
    [ $rc -ne 0 ] && status=$rc
    echo "== $k rc=$rc"
    od -An -tx1 -v out.bin
done
exit $status
