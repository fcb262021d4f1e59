/*
 * The metadata's temporary is ".metadata.<pid>-<n>-<random>.tmp", a name
 * unique to each publication (no fixed ".metadata.tmp"): tests that check
 * that none is left count every name of that form.
 */
#ifndef DCP_TEST_TMPNAMES_H
#define DCP_TEST_TMPNAMES_H

#include <dirent.h>
#include <string.h>

/* Names ".metadata.*.tmp" in dir (-1 when dir cannot be read). */
static int dcp_test_meta_tmps(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += l > 14 && !strncmp(e->d_name, ".metadata.", 10) &&
             !strcmp(e->d_name + l - 4, ".tmp");
    }
    closedir(d);
    return n;
}

#endif /* DCP_TEST_TMPNAMES_H */
