# .metadata cut short (the first 1000 of about 2000 bytes).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
dd if=ck/.metadata of=cut bs=1000 count=1 2>/dev/null || exit 125
mv cut ck/.metadata || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
