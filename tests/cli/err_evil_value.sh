# A value record (torch.save zip) whose pickle calls os.system: cat refuses
# it and nothing runs.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
python3 - <<'EOF' || exit 125
# Replace the record of the value "step" (a torch.save zip whose data.pkl is
# 80 02 4b 07 2e, the int 7) by a zip of the same length whose data.pkl calls
# os.system; .metadata stays as it is.
import io, os, pickle, struct, zipfile
p = "ck/__0_0.distcp"
data = bytearray(open(p, "rb").read())
starts = []
i = data.find(b"PK\x03\x04")
while i >= 0:
    n, e = struct.unpack_from("<HH", data, i + 26)
    if data[i + 30:i + 30 + n].endswith(b"/data.pkl"):
        starts.append(i)
    i = data.find(b"PK\x03\x04", i + 4)
target = None
for k, s in enumerate(starts):
    n, e = struct.unpack_from("<HH", data, s + 26)
    body = s + 30 + n + e
    if data[body:body + 9] == b"\x80\x02K\x07.PK\x07\x08":
        target = (s, starts[k + 1] if k + 1 < len(starts) else len(data))
assert target, "record of step not found"
start, end = target
class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))
def make(pad):
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle.dumps(Evil(), protocol=2))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        z.writestr("archive/zpad", b"Z" * pad)
    return b.getvalue()
rec = make(0)
rec = make(end - start - len(rec))
assert len(rec) == end - start, (len(rec), end - start)
data[start:end] = rec
open(p, "wb").write(data)
EOF
$DCPTOOL_PREFIX "$DCPTOOL" cat ck step
rc=$?
if [ -e pwned.txt ]; then echo "PWNED: pwned.txt was created"; exit 99; fi
exit $rc
