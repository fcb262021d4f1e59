/*
 * The commit sequence (commit.h): .metadata published through the storage
 * back end's commit primitive (dcp_storage.h, publish). On POSIX, and for
 * a back end without publish, that is a unique temporary
 * (.metadata.<pid>-<n>-<random>.tmp), fsync, rename over
 * .metadata, fsync of the directory. The order of the storage calls is
 * the protocol; tests/fault/test_commit_trace.c and strace_commit.py
 * check it.
 */
#include "commit.h"

#include "storage.h"

int dcp__commit_metadata(int dirfd, const char *dir,
                         const struct dcp_metadata *md, int sync, int *renamed,
                         struct dcp_err *err)
{
    return dcp__commit_metadata_as(dirfd, dir, ".metadata", md, sync, renamed,
                                   err);
}

int dcp__commit_metadata_as(int dirfd, const char *dir, const char *name,
                            const struct dcp_metadata *md, int sync,
                            int *renamed, struct dcp_err *err)
{
    struct dcp_buf b = {0};
    int rc;
    *renamed = 0;
    rc = dcp__meta_encode(md, &b);
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return dcp__err(err, rc, "cannot encode the metadata");
    }
    /* The commit point: once .metadata is visible the new checkpoint
     * exists (*renamed says whether a failure came after it). */
    rc = dcp__fs_publish(dirfd, dir, name, b.p, b.len,
                         sync ? 0u : DCP_PUBLISH_NOSYNC, renamed, err);
    dcp__buf_free(&b);
    return rc;
}
