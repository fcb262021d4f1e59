# --version prints the library and header versions.
$DCPTOOL_PREFIX "$DCPTOOL" --version
