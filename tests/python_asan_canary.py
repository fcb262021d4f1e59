"""The sanitised interpreter run's canary (ctest python.asan, before the
pytest suites). In a child with this process's environment (LD_PRELOAD of
the ASan runtime, ASAN_OPTIONS), the extension module in argv[1]'s
directory (build-asan/python/dcp_torch) is loaded alone (it links against
the runtime's symbols: it loads only when the runtime is there), then a
read of poisoned memory through an intercepted memmove must end the child
with AddressSanitizer's report and SIGABRT. Exit 0 when it does (so a
finding in the suites fails them); 1 otherwise."""

import os
import signal
import subprocess
import sys

CHILD = r"""
import ctypes, importlib.machinery, importlib.util, os
# the module alone (dcp_torch's package would import torch: slow here)
path = os.path.join(os.environ["DCP_TORCH_DIR"], "_C.abi3.so")
spec = importlib.util.spec_from_file_location(
    "_C", path, loader=importlib.machinery.ExtensionFileLoader("_C", path))
spec.loader.exec_module(importlib.util.module_from_spec(spec))
rt = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(64)
dst = ctypes.create_string_buffer(64)
rt.__asan_poison_memory_region(ctypes.cast(buf, ctypes.c_void_p), ctypes.c_size_t(64))
print("poisoned", flush=True)
ctypes.memmove(dst, buf, 8)
print("not caught", flush=True)
"""

env = dict(os.environ, DCP_TORCH_DIR=sys.argv[1])
r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                   timeout=120)
ok = (r.returncode == -signal.SIGABRT and "poisoned" in r.stdout
      and "not caught" not in r.stdout and "ERROR: AddressSanitizer" in r.stderr)
print(f"canary child: exit {r.returncode}, ASan report {'present' if 'ERROR: AddressSanitizer' in r.stderr else 'absent'}")
if not ok:
    sys.stderr.write(r.stdout + r.stderr)
    sys.exit(1)
