/*
 * Replays fuzz inputs through a target's LLVMFuzzerTestOneInput without
 * libFuzzer, so every normal build (gcc too) runs the committed corpora as
 * regression tests: each argument is a file or a directory of files (not
 * recursive), replayed in name order. A crash, sanitizer report or
 * abort() fails the test. Prints "N inputs replayed" and
 * "N passed, 0 failed".
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;
    if (!f)
        return -1;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return -1;
    }
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    /* An exact-size copy, so reads past the end are caught by ASan. */
    {
        uint8_t *exact = malloc((size_t)n ? (size_t)n : 1);
        if (!exact) {
            free(buf);
            return -1;
        }
        memcpy(exact, buf, (size_t)n);
        free(buf);
        (void)LLVMFuzzerTestOneInput(exact, (size_t)n);
        free(exact);
    }
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    long replayed = 0;
    int i, bad = 0;
    for (i = 1; i < argc; i++) {
        struct stat sb;
        DIR *d;
        struct dirent *de;
        char **names = NULL;
        size_t n = 0, cap = 0, k;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "cannot read '%s'\n", argv[i]);
            bad = 1;
            continue;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad |= run_file(argv[i]) != 0;
            replayed++;
            continue;
        }
        d = opendir(argv[i]);
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                names = realloc(names, cap * sizeof(*names));
                if (!names)
                    abort();
            }
            names[n] = malloc(strlen(argv[i]) + strlen(de->d_name) + 2);
            if (!names[n])
                abort();
            sprintf(names[n], "%s/%s", argv[i], de->d_name);
            n++;
        }
        if (d)
            closedir(d);
        qsort(names, n, sizeof(*names), cmp);
        for (k = 0; k < n; k++) {
            if (run_file(names[k]) != 0) {
                fprintf(stderr, "cannot read '%s'\n", names[k]);
                bad = 1;
            }
            replayed++;
            free(names[k]);
        }
        free(names);
    }
    printf("%ld inputs replayed\n", replayed);
    printf("%d passed, %d failed\n", bad ? 0 : 1, bad ? 1 : 0);
    return bad;
}
