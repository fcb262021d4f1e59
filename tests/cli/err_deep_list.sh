# .metadata: a list nested a million deep (EMPTY_LIST x N, APPEND x N-1).
# Refused cleanly (no stack overflow, no crash).
mkdir ck && cp "$DCP_TEST_DATA/torch_small/__0_0.distcp" ck/ || exit 125
python3 -c '
n = 1000000
open("ck/.metadata", "wb").write(b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b".")
' || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" info ck
