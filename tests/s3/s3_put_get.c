/*
 * Helper for test_boto3_interop.py: copies bytes between a local file and an
 * S3 object with dcp's client (configured from the AWS_* environment).
 *   s3_put_get put|mput|get BUCKET KEY FILE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3.h"

int main(int argc, char **argv)
{
    if (argc != 5)
        return 2;
    struct dcp__s3_config c = {0};
    c.part_size = 5u << 20;
    struct dcp__s3 *s3 = NULL;
    struct dcp_err err = {0};
    int rc = dcp__s3_create(&c, argv[2], &s3, &err);
    if (rc == DCP_OK && strcmp(argv[1], "get") == 0) {
        void *b = NULL;
        size_t n = 0;
        rc = dcp__s3_get(s3, argv[3], (size_t)1 << 30, &b, &n, &err);
        FILE *f = rc ? NULL : fopen(argv[4], "wb");
        if (f) {
            if (fwrite(b, 1, n, f) != n)
                rc = DCP_EIO;
            fclose(f);
        }
        dcp__free(b);
    } else if (rc == DCP_OK) {
        FILE *f = fopen(argv[4], "rb");
        if (!f)
            return 3;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *b = malloc((size_t)n + 1);
        if (!b || fread(b, 1, (size_t)n, f) != (size_t)n)
            return 3;
        fclose(f);
        rc = strcmp(argv[1], "mput") == 0
                 ? dcp__s3_put_multipart(s3, argv[3], b, (size_t)n, 0, &err)
                 : dcp__s3_put(s3, argv[3], b, (size_t)n, 0, &err);
        free(b);
    }
    dcp__s3_free(s3);
    if (rc) {
        fprintf(stderr, "s3_put_get: %s\n", err.msg);
        return 1;
    }
    return 0;
}
