#!/bin/sh
# Run by s3_env.py: a tier stack whose tier 1 is s3:// (4 ranks as 2
# nodes): drains to the bucket, retention there, restore from the bucket
# once every node's tier 0 is gone.   test_tier_s3.sh MPI_TIER DIR MPIEXEC...
set -e
prog=$1
dir=$2
shift 2
"$@" -n 4 "$prog" s3 "$dir" "s3://$DCP_S3_BUCKET/tier1"
echo "s3 tier: ok"
