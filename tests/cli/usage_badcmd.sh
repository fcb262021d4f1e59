# An unknown command.
$DCPTOOL_PREFIX "$DCPTOOL" frobnicate ck
