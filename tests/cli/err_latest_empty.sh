# latest of a root with no complete checkpoint: exit 1, naming the root.
mkdir -p root/step-3
$DCPTOOL_PREFIX "$DCPTOOL" latest root
