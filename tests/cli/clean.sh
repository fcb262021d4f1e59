# clean: leftovers of interrupted saves (data files and temporaries no
# .metadata names) removed; committed files, user files and links kept;
# a directory locked by a live writer refused, nothing removed.
cp -r "$DCP_TEST_DATA/torch_small" ck
printf 'xxxxxxxxxx' > ck/__3_0.distcp
printf 'xxxxx' > ck/__0_0.0123456789abcdef.distcp
printf 'xx' > ck/.metadata.12-0-deadbeef.tmp
echo mine > ck/notes.txt
ln -s notes.txt ck/__9_0.distcp
$DCPTOOL_PREFIX "$DCPTOOL" clean ck --json || exit $?
$DCPTOOL_PREFIX "$DCPTOOL" clean ck || exit $?
ls -A ck | sort
$DCPTOOL_PREFIX "$DCPTOOL" verify ck > /dev/null || exit 8
printf 'dcp-lock 1\nhost=%s\npid=1\nstart=0\ntoken=00000000000000aa\ntime=0\n' \
    "$(hostname)" > ck/.lock
printf 'x' > ck/__4_0.distcp
$DCPTOOL_PREFIX "$DCPTOOL" clean ck
echo "exit $?"
ls ck/__4_0.distcp
