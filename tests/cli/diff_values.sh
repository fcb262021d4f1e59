# diff of two checkpoints that differ: exit 1, one line per difference;
# within the tolerance the values count as equal.
h1='{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
h2='{"v":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}'
# w = [1.0, 2.0] and, in b, [1.0, 2.001] after an int8 v = 5
{ printf '\066\000\000\000\000\000\000\000%s' "$h1"; printf '\000\000\200\077\000\000\000\100'; } >a.safetensors
{ printf '\152\000\000\000\000\000\000\000%s' "$h2"; printf '\005\000\000\200\077\061\010\000\100'; } >b.safetensors
$DCPTOOL_PREFIX "$DCPTOOL" import a.safetensors a >/dev/null || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" import b.safetensors b >/dev/null || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" diff a a
echo "exit $?"
$DCPTOOL_PREFIX "$DCPTOOL" diff a b
echo "exit $?"
$DCPTOOL_PREFIX "$DCPTOOL" diff a b --rtol 1e-3
