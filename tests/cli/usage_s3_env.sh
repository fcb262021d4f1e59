# The S3 limits from the environment must be whole numbers from 1: a bad
# one is a usage error naming the variable (before any command runs).
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
DCP_S3_RETRY_BUDGET_MS=5s $DCPTOOL_PREFIX "$DCPTOOL" ls ck
