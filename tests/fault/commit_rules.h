/*
 * The commit protocol of docs/FORMAT.md section 5 as rules over a trace of
 * storage operations (faultfs's ff_event, successful ones), shared by the
 * single-process trace test and the MPI one (which merges every rank's
 * trace by CLOCK_MONOTONIC time):
 *  R1 every data file: created, written, synced after its last write, then
 *     closed, all before the metadata's temporary is created;
 *  R2 the metadata's temporary (".metadata.<pid>-<n>-<random>.tmp", a name
 *     unique to the save: no fixed ".metadata.tmp" that two writers could
 *     share): created, written, synced after its last write, closed, then
 *     renamed to .metadata (exactly once);
 *  R3 the directory is synced after that rename (the save returns only
 *     after the whole trace, so before success is reported);
 *  R4 no file of the checkpoint committed before is created, written,
 *     renamed or removed until the rename; removals of its files come only
 *     after the directory sync;
 *  R5 .metadata itself is never created or written (only renamed into);
 *  R6 one sync per file written, one directory sync, nothing more
 *     (no sync retried).
 * Returns NULL, or a description of the first violation in why.
 */
#ifndef DCP_COMMIT_RULES_H
#define DCP_COMMIT_RULES_H

#include <stdio.h>
#include <string.h>

#include "faultfs.h"

/* A name of the metadata's temporary (the negative controls use this
 * one), and the test for one: ".metadata." ... ".tmp". */
#define CR_TMP ".metadata.1-0-00000000.tmp"

static inline int cr_tmp_name(const char *s)
{
    size_t n = strlen(s);
    return n > 14 && !strncmp(s, ".metadata.", 10) && !strcmp(s + n - 4, ".tmp");
}

/* "<temporary>>.metadata": the faultfs name of the commit's rename. */
static inline int cr_commit_rename(const char *s)
{
    const char *gt = strchr(s, '>');
    char tmp[256];
    if (!gt || strcmp(gt, ">.metadata") || (size_t)(gt - s) >= sizeof(tmp))
        return 0;
    memcpy(tmp, s, (size_t)(gt - s));
    tmp[gt - s] = '\0';
    return cr_tmp_name(tmp);
}

static inline int cr_is(const struct ff_event *e, enum ff_op op,
                        const char *name)
{
    return e->rc == 0 && e->op == op && (!name || !strcmp(e->name, name));
}

static inline const char *cr_check(const struct ff_event *t, size_t n,
                            const char *old_files, char *why, size_t whylen)
{
    long create_tmp = -1, rename_i = -1, dsync = -1;
    size_t i, j, nfiles = 0, nsync = 0, ndsync = 0;
    char pat[100];
    for (i = 0; i < n; i++) {
        if (cr_is(&t[i], FF_CREATE, NULL) && cr_tmp_name(t[i].name) &&
            create_tmp < 0)
            create_tmp = (long)i;
        if (cr_is(&t[i], FF_RENAME, NULL) && cr_commit_rename(t[i].name)) {
            if (rename_i >= 0) {
                snprintf(why, whylen, "R2: .metadata.tmp renamed twice");
                return why;
            }
            rename_i = (long)i;
        }
        if (cr_is(&t[i], FF_SYNC, NULL))
            nsync++;
        if (cr_is(&t[i], FF_SYNC_DIR, NULL)) {
            ndsync++;
            if (rename_i >= 0 && dsync < 0)
                dsync = (long)i;
        }
        if ((cr_is(&t[i], FF_CREATE, ".metadata") ||
             cr_is(&t[i], FF_WRITE, ".metadata"))) {
            snprintf(why, whylen, "R5: event %zu writes .metadata in place", i);
            return why;
        }
    }
    if (create_tmp < 0 || rename_i < 0) {
        snprintf(why, whylen, "R2: no .metadata.tmp created and renamed");
        return why;
    }
    if (dsync < 0) {
        snprintf(why, whylen, "R3: no directory sync after the rename");
        return why;
    }
    /* R1 and R2: per file created. */
    for (i = 0; i < n; i++) {
        long lastw = -1, sync = -1, close = -1;
        int is_tmp;
        if (!cr_is(&t[i], FF_CREATE, NULL))
            continue;
        is_tmp = cr_tmp_name(t[i].name);
        nfiles++;
        for (j = i + 1; j < n; j++) {
            if (strcmp(t[j].name, t[i].name) || t[j].rc != 0)
                continue;
            if (t[j].op == FF_WRITE) {
                if (sync >= 0) {
                    snprintf(why, whylen, "R1: '%s' written after its sync",
                             t[i].name);
                    return why;
                }
                lastw = (long)j;
            } else if (t[j].op == FF_SYNC) {
                if (sync >= 0) {
                    snprintf(why, whylen, "R6: '%s' synced twice", t[i].name);
                    return why;
                }
                sync = (long)j;
            } else if (t[j].op == FF_CLOSE && close < 0) {
                close = (long)j;
            }
        }
        if (lastw < 0 || sync < 0 || close < 0 || !(lastw < sync) ||
            !(sync < close)) {
            snprintf(why, whylen,
                     "R%d: '%s' is not written, synced, closed in that order "
                     "(last write %ld, sync %ld, close %ld)",
                     is_tmp ? 2 : 1, t[i].name, lastw, sync, close);
            return why;
        }
        if (!is_tmp && close > create_tmp) {
            snprintf(why, whylen,
                     "R1: data file '%s' not durable (synced at %ld, closed "
                     "at %ld) before .metadata.tmp is created (%ld)",
                     t[i].name, sync, close, create_tmp);
            return why;
        }
        if (is_tmp && close > rename_i) {
            snprintf(why, whylen, "R2: .metadata.tmp renamed before closed");
            return why;
        }
    }
    /* R4. */
    for (i = 0; i < n; i++) {
        if (t[i].rc != 0 || (t[i].op != FF_CREATE && t[i].op != FF_WRITE &&
                             t[i].op != FF_UNLINK && t[i].op != FF_RENAME))
            continue;
        snprintf(pat, sizeof(pat), "|%s|", t[i].name);
        if (!strstr(old_files, pat))
            continue;
        if ((long)i < rename_i || t[i].op != FF_UNLINK) {
            snprintf(why, whylen,
                     "R4: %s of '%s', a file of the committed checkpoint, "
                     "before the commit",
                     ff_op_name(t[i].op), t[i].name);
            return why;
        }
        if ((long)i < dsync) {
            snprintf(why, whylen,
                     "R4: '%s' of the old checkpoint removed before the "
                     "directory sync",
                     t[i].name);
            return why;
        }
    }
    /* R6. */
    if (nsync != nfiles || ndsync != 1) {
        snprintf(why, whylen,
                 "R6: %zu syncs for %zu files written, %zu directory syncs",
                 nsync, nfiles, ndsync);
        return why;
    }
    return NULL;
}

#endif /* DCP_COMMIT_RULES_H */
