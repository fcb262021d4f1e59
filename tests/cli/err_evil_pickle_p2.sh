# The os.system pickle in protocol 2 (GLOBAL opcode), through verify.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
python3 - <<'EOF' || exit 125
import os, pickle
class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))
with open("ck/.metadata", "wb") as f:
    f.write(pickle.dumps(Evil(), protocol=2))
EOF
$DCPTOOL_PREFIX "$DCPTOOL" verify ck
rc=$?
if [ -e pwned.txt ]; then echo "PWNED: pwned.txt was created"; exit 99; fi
exit $rc
