#!/bin/sh
# Run by s3_env.py: save on 3 ranks to s3://, load on 2 and on 4 ranks,
# every byte checked by mpi_reshard; then the read-once load from s3://:
# io_bench's state saved on 1 rank, loaded whole on 3 (every element
# checked), each stored byte read once.
#   test_mpi_s3.sh MPI_RESHARD IO_BENCH MPIEXEC...
set -e
prog=$1
bench=$2
shift 2
ck="s3://$DCP_S3_BUCKET/mpi/reshard"
"$@" -n 3 "$prog" save "$ck"
"$@" -n 2 "$prog" load "$ck"
"$@" -n 4 "$prog" load "$ck"
# save again over it on 2 ranks (fresh names; the old objects removed)
"$@" -n 2 "$prog" save "$ck"
"$@" -n 3 "$prog" load "$ck"
# the read-once load: every rank wants everything (io_bench built)
if [ "$bench" = none ]; then
    echo "s3 mpi reshard: ok (read-once part skipped: no io_bench)"
    exit 0
fi
ro="s3://$DCP_S3_BUCKET/mpi/readonce"
"$@" -n 1 "$bench" save "$ro" --runs 1 --scale small > /dev/null
out=$("$@" -n 3 "$bench" load "$ro" --runs 1 --scale small --replicated 1)
echo "$out"
num() { echo "$out" | grep '^{' | grep -o "\"$1\": [0-9]*" | head -1 | grep -o '[0-9]*$'; }
bad=$(num bad_elements)
bytes=$(num bytes)
stored=$(num storage_bytes)
test -n "$bad" && test "$bad" -eq 0
test -n "$stored" && test "$stored" -ge "$bytes"
test "$stored" -le $((bytes + bytes / 100))
echo "s3 mpi reshard: ok"
