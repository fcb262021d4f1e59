# No arguments: usage on stderr, exit 2.
$DCPTOOL_PREFIX "$DCPTOOL"
