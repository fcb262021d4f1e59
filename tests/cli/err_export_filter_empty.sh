# a key filter that matches nothing: an error, no output file.
$DCPTOOL_PREFIX "$DCPTOOL" export "$DCP_TEST_DATA/torch_small" out.pt --keys 'nothing.*'
rc=$?
ls
exit $rc
