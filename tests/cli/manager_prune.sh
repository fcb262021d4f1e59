# prune --keep 1: removes step-10, the older complete one; leaves what is
# not complete and the link alone.
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
mkdir elsewhere
cp -r "$DCP_TEST_DATA/torch_small" elsewhere/keepme
$DCPTOOL_PREFIX "$DCPTOOL" prune root --keep 1 --json || exit $?
$DCPTOOL_PREFIX "$DCPTOOL" prune root --keep 1 || exit $?
ls -A root elsewhere/keepme
