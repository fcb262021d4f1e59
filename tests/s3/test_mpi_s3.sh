#!/bin/sh
# Run by s3_env.py: save on 3 ranks to s3://, load on 2 and on 4 ranks,
# every byte checked by mpi_reshard.   test_mpi_s3.sh MPI_RESHARD MPIEXEC...
set -e
prog=$1
shift
ck="s3://$DCP_S3_BUCKET/mpi/reshard"
"$@" -n 3 "$prog" save "$ck"
"$@" -n 2 "$prog" load "$ck"
"$@" -n 4 "$prog" load "$ck"
# save again over it on 2 ranks (fresh names; the old objects removed)
"$@" -n 2 "$prog" save "$ck"
"$@" -n 3 "$prog" load "$ck"
echo "s3 mpi reshard: ok"
