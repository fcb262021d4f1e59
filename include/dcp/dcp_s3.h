/*
 * dcp_s3.h: checkpoints in S3 and S3-compatible object stores.
 *
 * Every checkpoint path of the API (dcp_save, dcp_save_async, dcp_load,
 * dcp_metadata_open and the inspection calls, dcp_export's input,
 * dcp_import's output) and of dcptool may be "s3://bucket/prefix": the
 * checkpoint's files are then the objects "prefix/.metadata",
 * "prefix/__0_0.distcp", ... of bucket. Such a path is served by the
 * built-in S3 back end whatever storage back end the context was given
 * (dcp_storage.h); a path without "s3://" is a file path as always.
 *
 * The S3 back end writes each data file as one object: a multipart upload
 * whose parts go up as the file is written, up to max_inflight below in
 * flight (the file's sender threads; a writer waits when max_inflight + 2
 * full parts are not sent yet, so a file holds at most that many parts
 * beside those being filled and one per writer waiting, at most io_depth),
 * or one PUT when the file is smaller than a part; reads are ranged GETs,
 * CRCs verified as for files. A load fetches the records it reads whole
 * (up to 32 MiB each) with their headers, neighbouring records together,
 * in ranges of up to min(part size, 8 MiB), max_inflight at once, about
 * 128 MiB per round held in memory until copied out (a round's last
 * tensor may add up to 32 MiB); other reads are ranged GETs coalesced by
 * the engine. A save commits as on files (docs/FORMAT.md):
 * every rank's objects are complete before rank 0 PUTs "prefix/.metadata",
 * the commit point; a save over an existing checkpoint writes data objects
 * under fresh names, so the old checkpoint loads until the new .metadata
 * replaces it. A failed save aborts its multipart uploads and deletes the
 * objects it completed; a killed one leaves only unreferenced objects and
 * incomplete uploads (invisible; give the bucket a lifecycle rule that
 * aborts incomplete multipart uploads). Details: docs/S3.md.
 *
 * Configuration follows the AWS conventions: AWS_ACCESS_KEY_ID,
 * AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION (then
 * AWS_DEFAULT_REGION, then us-east-1), AWS_ENDPOINT_URL_S3 then
 * AWS_ENDPOINT_URL (none: AWS itself). With a custom endpoint requests
 * are path style (http://host:port/bucket/key). dcp_s3_configure sets any
 * of these for the whole process; a field it sets wins over the
 * environment. Data PUTs and multipart parts carry a CRC32 checksum that
 * the server verifies, unless AWS_REQUEST_CHECKSUM_CALCULATION is
 * "when_required" (any case; environment only): they then carry
 * Content-MD5 and their ETag must be that MD5 (as PUTs of up to 1 MiB
 * always do; not checked under SSE-KMS and SSE-C, where S3's ETag is no
 * MD5).
 *
 * Without libcurl and libcrypto at build time there is no S3 back end: an
 * s3:// path fails with DCP_ENOTSUP and dcp_s3_configure returns
 * DCP_ENOTSUP.
 */
#ifndef DCP_DCP_S3_H
#define DCP_DCP_S3_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Process-wide S3 settings. Zero-initialise and set struct_size =
 * sizeof(dcp_s3_config); fields are only ever appended, and a caller
 * compiled against an older, shorter struct gets the defaults for the
 * fields it does not know. A NULL string or a 0 number means "from the
 * environment, else the default" as said beside it.
 */
typedef struct dcp_s3_config {
    uint32_t struct_size;
    /* 0: path style with a custom endpoint, virtual-host style on AWS;
     * 1: always path style; 2: always virtual-host style. */
    int32_t addressing;
    const char *access_key;    /* AWS_ACCESS_KEY_ID (required) */
    const char *secret_key;    /* AWS_SECRET_ACCESS_KEY (required) */
    const char *session_token; /* AWS_SESSION_TOKEN */
    const char *region;        /* AWS_REGION, AWS_DEFAULT_REGION, us-east-1 */
    /* AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; none: https://s3.<region>.
     * amazonaws.com. "http://host[:port]" or "https://...", no path. */
    const char *endpoint;
    /* Requests of one checkpoint served at once (the back end's
     * max_inflight: the I/O engine's requests), and parts of one written
     * file in flight (its sender threads): 16, at most 256. */
    uint32_t max_inflight;
    uint32_t max_attempts; /* per request, 8 */
    /* Multipart part size in bytes: 8 MiB, 5 MiB .. 5 GiB. A data file
     * may have at most 10000 parts. */
    uint64_t part_size;
    int64_t connect_timeout_ms; /* 5000 */
    /* A transfer moving less than 1 byte/s for this long is cut: 10000. */
    int64_t stall_timeout_ms;
    int64_t retry_budget_ms; /* per request, backoff included: 120000 */
    /* Retry k sleeps a uniform time in [0, min(cap, base * 2^k)]. */
    int64_t backoff_base_ms; /* 100 */
    int64_t backoff_cap_ms;  /* 5000 */
} dcp_s3_config;

/*
 * Sets the S3 settings of the process (cfg NULL: back to the environment
 * and defaults only). Strings are copied. Takes effect for checkpoint
 * paths opened after it returns; saves and loads in progress keep the
 * settings they started with. Returns DCP_OK, DCP_EINVAL (struct_size 0
 * or above sizeof(dcp_s3_config), part_size or max_inflight out of range,
 * addressing not 0..2), DCP_ENOMEM, DCP_ENOTSUP (built without S3). Not
 * collective (call it on every rank); thread safe.
 */
DCP_API int dcp_s3_configure(const dcp_s3_config *cfg);

/* 1 when path names an S3 checkpoint ("s3://..."), else 0. Thread safe. */
DCP_API int dcp_path_is_s3(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_S3_H */
