# list of a missing root: exit 1, naming it.
$DCPTOOL_PREFIX "$DCPTOOL" list no-such-root
