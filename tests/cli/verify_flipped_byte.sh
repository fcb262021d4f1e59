# One flipped bit inside model.w's elements: verify finds the CRC mismatch
# and names the key and the data file.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
python3 - <<'EOF' || exit 125
import struct
p = "ck/__0_0.distcp"
data = bytearray(open(p, "rb").read())
w = struct.pack("<12f", *[(i - 4) / 4 for i in range(12)])
at = data.find(w)
assert at >= 0 and data.find(w, at + 1) < 0, "model.w's bytes not found once"
data[at + 21] ^= 0x40
open(p, "wb").write(data)
EOF
$DCPTOOL_PREFIX "$DCPTOOL" verify ck 2>err.txt
rc=$?
cat err.txt >&2
grep -q 'model\.w' err.txt || echo "the message does not name the key model.w"
grep -q '__0_0\.distcp' err.txt || echo "the message does not name __0_0.distcp"
exit $rc
