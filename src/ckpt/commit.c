/*
 * The commit sequence (commit.h): .metadata.tmp, fsync, rename over
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
    static const char tmp[] = ".metadata.tmp";
    struct dcp_buf b = {0};
    int fd = -1, rc;
    *renamed = 0;
    rc = dcp__meta_encode(md, &b);
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return dcp__err(err, rc, "cannot encode the metadata");
    }
    rc = dcp__fs_create(dirfd, tmp, &fd, err);
    if (rc == DCP_OK)
        rc = dcp__fs_pwrite(fd, b.p, b.len, 0, tmp, err);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync(fd, tmp, err);
    if (fd >= 0) {
        if (rc == DCP_OK)
            rc = dcp__fs_close(fd, tmp, err);
        else
            dcp__fs_release(fd);
    }
    dcp__buf_free(&b);
    /* The commit point: after this rename the new checkpoint exists. */
    if (rc == DCP_OK)
        rc = dcp__fs_rename(dirfd, tmp, ".metadata", err);
    if (rc == DCP_OK)
        *renamed = 1;
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync_dir(dirfd, dir, err);
    if (rc != DCP_OK)
        (void)dcp__fs_unlink(dirfd, tmp, NULL);
    return rc;
}
