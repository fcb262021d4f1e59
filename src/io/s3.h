/*
 * S3 client (internal): SigV4-signed requests through libcurl, retried with
 * exponential backoff and full jitter, bounded in attempts, total time and
 * per-transfer stall time. Built only where CMake finds libcurl and OpenSSL's
 * libcrypto (DCP_HAVE_S3); the storage back end over it is fs_s3.c
 * (docs/S3.md).
 *
 * Errors: every function returns DCP_OK or a DCP_E* code and fills err with
 * a message naming the bucket/key, the byte offset where it applies and the
 * HTTP status and S3 error code the server sent:
 *   DCP_EINVAL    bad URL, bucket or key name; the server refused the
 *                 credentials or the signature (HTTP 403: AccessDenied,
 *                 InvalidAccessKeyId, SignatureDoesNotMatch, ...); other 4xx
 *   DCP_ENOENT    no such key (404 NoSuchKey) or no such bucket (NoSuchBucket)
 *   DCP_EEXIST    a conditional put found the key present (412)
 *   DCP_EBUSY     an If-Match put found another version, or none
 *                 (dcp__s3_put_if)
 *   DCP_ENOTSUP   the server does not implement what was asked (501
 *                 NotImplemented: a conditional header), not retried
 *   DCP_ECORRUPT  the server's answer disagrees with what was asked or sent
 *                 (short or long body, Content-Length, Content-Range, ETag)
 *                 after every attempt
 *   DCP_EIO       5xx, SlowDown, connection errors after every attempt
 *   DCP_ETIMEOUT  the retry budget (total time) ran out, or a stall
 *   DCP_ELIMIT    an answer (listing, error body) larger than allowed
 *   DCP_ENOMEM
 *
 * Thread safety: one struct dcp__s3 may be used from many threads at once;
 * every call owns its curl handles and the shared handle (connection pool,
 * DNS and TLS session cache) is locked internally. The configuration is
 * copied at create time and never changes.
 */
#ifndef DCP_S3_H
#define DCP_S3_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/*
 * Configuration. Zero-initialise; a NULL string or 0 number takes the AWS
 * environment variable or the default named beside it.
 */
struct dcp__s3_config {
    const char *access_key;    /* AWS_ACCESS_KEY_ID (required) */
    const char *secret_key;    /* AWS_SECRET_ACCESS_KEY (required) */
    const char *session_token; /* AWS_SESSION_TOKEN (optional) */
    const char *region;        /* AWS_REGION, AWS_DEFAULT_REGION, "us-east-1" */
    /* AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL; none: https://s3.<region>.
     * amazonaws.com. http:// or https://, host[:port], no path. */
    const char *endpoint;
    /* 0: path style with a custom endpoint, virtual-host style for AWS;
     * 1: always path style; 2: always virtual-host style. */
    int addressing;
    long connect_timeout_ms; /* 5000 */
    /* A transfer slower than 1 byte/s for this long is cut: 10 s. */
    long stall_timeout_ms;
    int max_attempts;     /* per request, 8 */
    long retry_budget_ms; /* total time per request incl. backoff, 120000 */
    long backoff_base_ms; /* 100; attempt k sleeps U(0, min(cap, base*2^k)) */
    long backoff_cap_ms;  /* 5000 */
    int max_in_flight;    /* parallel requests of one call, 16 (max 256) */
    size_t part_size;     /* multipart part size, 8 MiB (5 MiB .. 5 GiB) */
};

struct dcp__s3;

/*
 * Parses "s3://bucket[/prefix]" into fresh strings (dcp__free). The bucket
 * must be a valid S3 bucket name (3..63 of [a-z0-9.-], starting and ending
 * with a letter or digit, no "..", not an IP address); the prefix a valid
 * key prefix (UTF-8, at most 1024 bytes, no control characters). A prefix
 * is returned without a trailing '/' ("" for none).
 */
int dcp__s3_parse_url(const char *url, char **bucket, char **prefix,
                      struct dcp_err *err);
/* 0 when key is a valid object key (1..1024 bytes of UTF-8, no control
 * characters), else DCP_EINVAL with a message. */
int dcp__s3_check_key(const char *key, struct dcp_err *err);

/* A client bound to one bucket. */
int dcp__s3_create(const struct dcp__s3_config *cfg, const char *bucket,
                   struct dcp__s3 **out, struct dcp_err *err);
void dcp__s3_free(struct dcp__s3 *s3);

/* Object metadata from HEAD. etag is the quoted ETag as sent. */
struct dcp__s3_stat {
    int64_t size;
    char etag[80];
};
int dcp__s3_head(struct dcp__s3 *s3, const char *key, struct dcp__s3_stat *st,
                 struct dcp_err *err);

/*
 * Reads exactly len bytes at offset off (a ranged GET; len 0 reads nothing
 * and asks nothing). Content-Length and Content-Range must match the range
 * asked; anything else is retried, then DCP_ECORRUPT.
 */
int dcp__s3_get_range(struct dcp__s3 *s3, const char *key, int64_t off,
                      void *buf, size_t len, struct dcp_err *err);
/* Reads n ranges (lens[i] bytes at offs[i] into bufs[i], each 1 ..
 * part_size bytes), up to max_in_flight at once, each checked as by
 * dcp__s3_get_range. */
int dcp__s3_get_ranges(struct dcp__s3 *s3, const char *key, size_t n,
                       const int64_t *offs, const size_t *lens, void **bufs,
                       struct dcp_err *err);
/* Reads a whole object of at most max bytes into *buf (dcp__free). */
int dcp__s3_get(struct dcp__s3 *s3, const char *key, size_t max, void **buf,
                size_t *len, struct dcp_err *err);

#define DCP__S3_ETAG 80 /* an ETag as sent, quotes included, and its NUL */
/* dcp__s3_get, also giving the object's ETag as the server sent it
 * (quotes included) for dcp__s3_put_if; "" when the answer had none, or
 * one unfit for a header (not 1..78 visible ASCII characters). */
int dcp__s3_get_etag(struct dcp__s3 *s3, const char *key, size_t max,
                     void **buf, size_t *len, char etag[DCP__S3_ETAG],
                     struct dcp_err *err);

enum dcp__s3_put_flags {
    /* Fail with DCP_EEXIST if the key exists (If-None-Match: *). */
    DCP__S3_PUT_EXCLUSIVE = 1 << 0,
};
/* Whole-object PUT with its CRC-32 checksum (a CRC the answer states must
 * match; the ETag must be 32 hex digits); without checksums, and for
 * bodies up to 1 MiB with them, also Content-MD5 and the returned ETag the
 * MD5 (not checked when the answer names SSE-KMS or SSE-C). */
int dcp__s3_put(struct dcp__s3 *s3, const char *key, const void *buf,
                size_t len, unsigned flags, struct dcp_err *err);
/* dcp__s3_put; with if_match (an ETag from dcp__s3_get_etag) also
 * If-Match: the object is replaced only if it is still that version
 * (AWS S3 since November 2024, radosgw and moto honour it): DCP_EBUSY
 * when it is another version now or gone (404 NoSuchKey; a missing bucket
 * stays DCP_ENOENT). A 412 is tried once more with the ETag in the other
 * form (quoted or bare: radosgw 16 wants it bare), which is then sent
 * first to that endpoint; only a success of that try counts. A store that
 * ignores If-Match replaces the object whatever it is; one that answers
 * 501 gives DCP_ENOTSUP. */
int dcp__s3_put_if(struct dcp__s3 *s3, const char *key, const void *buf,
                   size_t len, unsigned flags, const char *if_match,
                   struct dcp_err *err);

/*
 * Multipart upload of buf: create, parts of cfg.part_size with up to
 * max_in_flight in flight (each checked as dcp__s3_put checks a PUT),
 * complete with the part list (exclusive when flags say so). Any failure
 * aborts the upload, so no parts are left behind.
 */
int dcp__s3_put_multipart(struct dcp__s3 *s3, const char *key, const void *buf,
                          size_t len, unsigned flags, struct dcp_err *err);

/*
 * A multipart upload step by step (the storage back end's writer, fs_s3.c):
 * create hands out the upload id (NUL-terminated, in cap bytes); part sends
 * part partno (1..10000; every part but the last at least 5 MiB) and gives
 * its tag for complete: the ETag the server answered (32 hex digits),
 * then ':' and its CRC-32 in base64
 * when the client sends
 * checksums (the upload was created with CRC32, and the server checks
 * every part against it; AWS_REQUEST_CHECKSUM_CALCULATION=when_required
 * turns checksums off);
 * complete (exclusive when flags say so: a key that exists is refused
 * with DCP_EEXIST after a HEAD on any store, and the completion carries
 * If-None-Match: * against a racing writer, which only stores honouring it
 * on completions refuse: AWS S3 and moto do, radosgw 16 does not — a
 * single exclusive PUT is atomic on all three) makes the object; abort discards
 * the upload and its parts (err may be NULL). Parts of one upload may be
 * sent from many threads at once.
 */
#define DCP__S3_TAG 48 /* a part's tag: 32 + 1 + 8 + NUL, rounded */

int dcp__s3_mpu_create(struct dcp__s3 *s3, const char *key, char *upid,
                       size_t cap, struct dcp_err *err);
int dcp__s3_mpu_part(struct dcp__s3 *s3, const char *key, const char *upid,
                     unsigned partno, const void *buf, size_t len,
                     char tag[DCP__S3_TAG], struct dcp_err *err);
int dcp__s3_mpu_complete(struct dcp__s3 *s3, const char *key, const char *upid,
                         size_t nparts, const char (*tags)[DCP__S3_TAG],
                         unsigned flags, struct dcp_err *err);
int dcp__s3_mpu_abort(struct dcp__s3 *s3, const char *key, const char *upid,
                      struct dcp_err *err);

int dcp__s3_delete(struct dcp__s3 *s3, const char *key, struct dcp_err *err);
/* Deletes n keys, max_in_flight at a time; a missing key is not an error. */
int dcp__s3_delete_many(struct dcp__s3 *s3, const char *const *keys, size_t n,
                        struct dcp_err *err);

/*
 * Lists keys under prefix (ListObjectsV2, following continuation tokens),
 * calling fn(key, size, ud) for each; fn returning non-zero stops the
 * listing with that code. At most max_keys keys (more: DCP_ELIMIT).
 */
typedef int (*dcp__s3_list_fn)(const char *key, int64_t size, void *ud);
int dcp__s3_list(struct dcp__s3 *s3, const char *prefix, size_t max_keys,
                 dcp__s3_list_fn fn, void *ud, struct dcp_err *err);

/* dcp__s3_list; with delim, one level only (delimiter "/"): the keys
 * directly under prefix, and each deeper "directory" once, as its common
 * prefix ("<prefix><name>/") with size -1 — so listing a directory costs
 * its own entries, not every key below it. */
int dcp__s3_list_delim(struct dcp__s3 *s3, const char *prefix, int delim,
                       size_t max_keys, dcp__s3_list_fn fn, void *ud,
                       struct dcp_err *err);

/*
 * Lists the multipart uploads in progress under prefix
 * (ListMultipartUploads, following the markers), calling fn(key,
 * upload_id, ud) for each; fn returning non-zero stops with that code. At
 * most max uploads (more: DCP_ELIMIT).
 */
#define DCP__S3_UPID_MAX 1100 /* an upload id's bytes, with its NUL */
typedef int (*dcp__s3_upload_fn)(const char *key, const char *upid, void *ud);
int dcp__s3_list_uploads(struct dcp__s3 *s3, const char *prefix, size_t max,
                         dcp__s3_upload_fn fn, void *ud, struct dcp_err *err);

/* Number of multipart uploads in progress under prefix (for tests and
 * cleanup checks). */
int dcp__s3_count_uploads(struct dcp__s3 *s3, const char *prefix, size_t *count,
                          struct dcp_err *err);

/*
 * Checks that the bucket exists and prefix can be listed with the client's
 * credentials: one listing of at most one key (DCP_ENOENT "no such
 * bucket", DCP_EINVAL for refused credentials, ...), skipped when this
 * process found the same prefix listable with the same endpoint, region
 * and credentials within the last 60 s (a load opens a checkpoint twice;
 * a vanished bucket then fails the next request instead). Thread safe.
 */
int dcp__s3_check_bucket(struct dcp__s3 *s3, const char *prefix,
                         struct dcp_err *err);

/* HTTP requests this process has sent so far (each attempt counts): GETs
 * (get nonzero) or the others. For tests and benchmarks; thread safe. */
uint64_t dcp__s3_requests(int get);

#endif
