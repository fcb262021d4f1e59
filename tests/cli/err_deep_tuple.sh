# .metadata: tuples nested a million deep (MARK x N, TUPLE x N).
mkdir ck && cp "$DCP_TEST_DATA/torch_small/__0_0.distcp" ck/ || exit 125
python3 -c '
n = 1000000
open("ck/.metadata", "wb").write(b"\x80\x02" + b"(" * n + b"t" * n + b".")
' || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
