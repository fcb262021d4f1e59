# .metadata is a pickle (protocol 4, Python's default) whose __reduce__
# calls os.system: refused, and nothing runs.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
python3 - <<'EOF' || exit 125
import os, pickle
class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))
with open("ck/.metadata", "wb") as f:
    f.write(pickle.dumps(Evil(), protocol=4))
EOF
$DCPTOOL_PREFIX "$DCPTOOL" info ck
rc=$?
if [ -e pwned.txt ]; then echo "PWNED: pwned.txt was created"; exit 99; fi
exit $rc
