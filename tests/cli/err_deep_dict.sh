# .metadata: dicts nested a million deep (EMPTY_DICT, then key and a new
# dict N times, SETITEM N times).
mkdir ck && cp "$DCP_TEST_DATA/torch_small/__0_0.distcp" ck/ || exit 125
python3 -c '
n = 1000000
open("ck/.metadata", "wb").write(b"\x80\x02}" + b"K\x01}" * n + b"s" * n + b".")
' || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
