# ls --json: the same keys as JSON strings (\n, \t, \u001b; DEL and the
# backslash as JSON writes them).
h='{"a\nb":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"c\td":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"e\u001bf\\g":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"h\u007fi":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}'
# a\nb = 1.0, c\td = 2.0, e<ESC>f\g = 3.0, h<DEL>i = 4.0
{ printf '\357\000\000\000\000\000\000\000%s' "$h"; printf '\000\000\200\077\000\000\000\100\000\000\100\100\000\000\200\100'; } >ctl.safetensors
$DCPTOOL_PREFIX "$DCPTOOL" import ctl.safetensors ck >/dev/null || exit 125
$DCPTOOL_PREFIX "$DCPTOOL" ls ck --json
