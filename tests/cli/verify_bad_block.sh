# A checkpoint written by dcp (import of a 3 MiB safetensors tensor) has
# block CRCs (docs/FORMAT.md §4): one flipped bit in its third 1 MiB block
# is reported by verify with the key, the data file, the block and the
# block's byte offset in the file.
python3 - <<'PY' || exit 125
import json, struct
n = 3 << 20
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}})
h += " " * (-len(h) % 8)
data = bytes((i * 7 + (i >> 12)) & 255 for i in range(n))
with open("w.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h.encode() + data)
PY
$DCPTOOL_PREFIX "$DCPTOOL" import w.safetensors ck >/dev/null || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" verify ck >/dev/null || exit 125
python3 - <<'PY' || exit 125
import os
p = [os.path.join("ck", f) for f in os.listdir("ck") if f.endswith(".distcp")][0]
b = bytearray(open(p, "rb").read())
head = bytes((i * 7 + (i >> 12)) & 255 for i in range(64))
at = b.find(head)
assert at > 0, at  # the first copy is the data start
b[at + (2 << 20) + 12345] ^= 0x40
open(p, "wb").write(b)
open("want.txt", "w").write("block 2 of the data in '%s' (record at byte "
                            % os.path.basename(p))
open("want2.txt", "w").write("block at byte %d, 1048576 bytes)"
                             % (at + (2 << 20)))
PY
$DCPTOOL_PREFIX "$DCPTOOL" verify ck 2>err.txt
rc=$?
cat err.txt >&2
grep -qF "$(cat want.txt)" err.txt || echo "the message does not name the block: $(cat want.txt)"
grep -qF "$(cat want2.txt)" err.txt || echo "the message does not name the offset: $(cat want2.txt)"
exit $rc
