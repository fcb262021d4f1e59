# prune --keep 0 keeps every complete step, as keep_last = 0 does in
# dcp_manager_options (it was a usage error).
mkdir root
cp -r "$DCP_TEST_DATA/torch_small" root/step-10
cp -r "$DCP_TEST_DATA/torch_small" root/step-20
$DCPTOOL_PREFIX "$DCPTOOL" prune root --keep 0 || exit $?
ls -A root
