/*
 * Growth of the hash table of hashtab.h (its lookups are inline there).
 * Growing re-places every element by the hash of its key, read from the
 * caller's array through the key function: the table stores no hashes, so
 * that a slot stays 4 bytes (8 Mi chunks' worth of lookups run through
 * tables like these).
 */
#include "hashtab.h"

#include "util.h"

#define HTAB_MIN_CAP 64

int dcp__htab_reserve(struct dcp_htab *t, size_t n, dcp_htab_key_fn keyof,
                      const void *arr)
{
    size_t cap = t->cap ? t->cap : HTAB_MIN_CAP, i;
    uint32_t *slot;
    if (n > UINT32_MAX - 1)
        return DCP_ELIMIT;
    while (n > cap / 2) {
        if (cap > SIZE_MAX / 2 / sizeof(*slot))
            return DCP_ELIMIT;
        cap *= 2;
    }
    if (cap == t->cap)
        return DCP_OK;
    slot = dcp__calloc(cap, sizeof(*slot));
    if (!slot)
        return DCP_ENOMEM;
    for (i = 0; i < t->cap; i++) {
        uint32_t s = t->slot[i];
        size_t len, j;
        const void *k;
        if (!s)
            continue;
        k = keyof(arr, s - 1, &len);
        j = (size_t)dcp__fnv1a64(k, len) & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = s;
    }
    dcp__free(t->slot);
    t->slot = slot;
    t->cap = cap;
    return DCP_OK;
}

void dcp__htab_release(struct dcp_htab *t)
{
    dcp__free(t->slot);
    t->slot = NULL;
    t->cap = 0;
    t->n = 0;
}
