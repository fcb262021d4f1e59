# a safetensors file whose two tensors overlap: refused, no checkpoint.
h='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}'
{ printf '\154\000\000\000\000\000\000\000'; printf '%s' "$h"; printf '000000000000'; } >bad.safetensors
$DCPTOOL_PREFIX "$DCPTOOL" import bad.safetensors ck
rc=$?
ls ck 2>/dev/null
exit $rc
