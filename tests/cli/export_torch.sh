# export to one torch.save file (from the name), then import it back: the
# same entries, diff finds no difference.
$DCPTOOL_PREFIX "$DCPTOOL" export "$DCP_TEST_DATA/torch_mixed" out.pt --no-fsync || exit 1
$DCPTOOL_PREFIX "$DCPTOOL" import out.pt back --no-fsync || exit 1
$DCPTOOL_PREFIX "$DCPTOOL" ls back
$DCPTOOL_PREFIX "$DCPTOOL" diff "$DCP_TEST_DATA/torch_mixed" back
