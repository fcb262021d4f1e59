# rm through a symbolic link is refused, the target untouched.
mkdir root
cp -r "$DCP_TEST_DATA/torch_small" target
ln -s ../target root/step-1
$DCPTOOL_PREFIX "$DCPTOOL" rm root/step-1
rc=$?
test -f target/.metadata || echo "target damaged"
exit $rc
