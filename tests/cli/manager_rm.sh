# rm: one checkpoint removed (.metadata first), then list; a directory
# holding a file that is not a checkpoint's is refused, nothing removed.
mkdir root
cp -r "$DCP_TEST_DATA/torch_small" root/step-10
cp -r "$DCP_TEST_DATA/torch_small" root/step-20
mkdir root/step-30
cp "$DCP_TEST_DATA"/torch_small/*.distcp root/step-30/
mkdir root/step-40
printf "not a pickle" > root/step-40/.metadata
ln -s ../elsewhere root/step-50
echo hi > root/notes.txt
mkdir root/step-007
$DCPTOOL_PREFIX "$DCPTOOL" rm root/step-20 --json || exit $?
$DCPTOOL_PREFIX "$DCPTOOL" rm root/step-10 || exit $?
$DCPTOOL_PREFIX "$DCPTOOL" list root
mkdir other
echo precious > other/notes.txt
$DCPTOOL_PREFIX "$DCPTOOL" rm other 2>/dev/null && exit 9
cat other/notes.txt
