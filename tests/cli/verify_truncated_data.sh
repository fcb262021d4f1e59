# The data file cut short in the middle of model.b's record: verify fails
# and names the key and the file.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
dd if=ck/__0_0.distcp of=cut bs=1000 count=5 2>/dev/null || exit 125
mv cut ck/__0_0.distcp || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" verify ck 2>err.txt
rc=$?
cat err.txt >&2
grep -q 'model\.b' err.txt || echo "the message does not name the key model.b"
grep -q '__0_0\.distcp' err.txt || echo "the message does not name __0_0.distcp"
exit $rc
