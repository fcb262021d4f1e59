# info on a directory that does not exist.
$DCPTOOL_PREFIX "$DCPTOOL" info no_such_dir
