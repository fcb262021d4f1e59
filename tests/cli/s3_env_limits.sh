# Valid S3 limits from the environment are taken (dcp_s3_configure) and
# change nothing for a local checkpoint.
cp -R "$DCP_TEST_DATA/torch_small" ck || exit 125
DCP_S3_MAX_ATTEMPTS=2 DCP_S3_RETRY_BUDGET_MS=1500 DCP_S3_STALL_TIMEOUT_MS=1000 \
    DCP_S3_CONNECT_TIMEOUT_MS=1000 $DCPTOOL_PREFIX "$DCPTOOL" ls ck
