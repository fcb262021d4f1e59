# list --json: the same as objects; a corrupt one says why.
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
$DCPTOOL_PREFIX "$DCPTOOL" list root --json
