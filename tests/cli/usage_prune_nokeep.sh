# prune without --keep (or --keep 0): bad usage, nothing removed.
$DCPTOOL_PREFIX "$DCPTOOL" prune root
