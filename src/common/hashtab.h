/*
 * The library's one hash table, for lookups by name: the entries of a
 * state, the keys of the global plan, the parameters of a statedict, the
 * data files of a metadata.
 *
 * The table holds no keys. Each slot holds the index + 1 of an element of
 * the caller's array (0 = empty), and the caller says where element i's
 * key is with a key function. Keys are byte strings compared with their
 * lengths, hashed with FNV-1a 64 and probed linearly; the table is kept at
 * most half full. Elements are only added, never removed.
 *
 * Not thread-safe: a table and the array it indexes are used by one
 * thread at a time (readers only may share it).
 */
#ifndef DCP_HASHTAB_H
#define DCP_HASHTAB_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Zero-initialised ({0}) is an empty table; dcp__htab_release frees it. */
struct dcp_htab {
    uint32_t *slot; /* cap slots, owned; NULL while cap is 0 */
    size_t cap;     /* 0 or a power of two, at least 2 * n */
    size_t n;       /* slots in use */
};

/* Element i of the caller's array arr: where its key's bytes are, their
 * count in *len. An element's key must not change while it is in the
 * table (its storage may move: the table holds only indices). */
typedef const void *(*dcp_htab_key_fn)(const void *arr, uint32_t i,
                                       size_t *len);

/* FNV-1a, 64 bits: the hash of nothing, and h extended by the n bytes at
 * p (so a key made of pieces hashes as their concatenation would). */
#define DCP__FNV1A64_INIT 0xcbf29ce484222325ULL
static inline uint64_t dcp__fnv1a64_add(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* FNV-1a, 64 bits, of the n bytes at p. */
static inline uint64_t dcp__fnv1a64(const void *p, size_t n)
{
    return dcp__fnv1a64_add(DCP__FNV1A64_INIT, p, n);
}

/*
 * The slot of key[0..len): the one that holds its element's index + 1, or
 * the empty slot where that goes (then dcp__htab_set fills it, provided
 * nothing was added since). t->cap must not be 0: dcp__htab_reserve first.
 * Inline so that a constant keyof is inlined into the probe loop.
 */
static inline size_t dcp__htab_slot(const struct dcp_htab *t, const void *key,
                                    size_t len, dcp_htab_key_fn keyof,
                                    const void *arr)
{
    size_t m = t->cap - 1, j = (size_t)dcp__fnv1a64(key, len) & m;
    uint32_t s;
    while ((s = t->slot[j]) != 0) {
        size_t klen;
        const void *k = keyof(arr, s - 1, &klen);
        if (klen == len && memcmp(k, key, len) == 0)
            break;
        j = (j + 1) & m;
    }
    return j;
}

/* Index + 1 of the element whose key is key[0..len), 0 when there is none
 * (an empty table included). */
static inline uint32_t dcp__htab_get(const struct dcp_htab *t, const void *key,
                                     size_t len, dcp_htab_key_fn keyof,
                                     const void *arr)
{
    return t->cap ? t->slot[dcp__htab_slot(t, key, len, keyof, arr)] : 0;
}

/* Records element i in slot j, an empty slot that dcp__htab_slot returned
 * for i's key after the last dcp__htab_reserve (which made room for it). */
static inline void dcp__htab_set(struct dcp_htab *t, size_t j, uint32_t i)
{
    t->slot[j] = i + 1;
    t->n++;
}

/*
 * Room for n elements in at most half the slots (at least 64 slots):
 * grows by doubling and puts the elements already in t into the new slots,
 * reading their keys with keyof(arr, i). Slots returned by dcp__htab_slot
 * before a growth are stale. Returns DCP_OK; DCP_ELIMIT when n is over
 * UINT32_MAX - 1 (an index + 1 must fit a slot) or the slots would not fit
 * a size_t; DCP_ENOMEM. On an error t is unchanged.
 */
int dcp__htab_reserve(struct dcp_htab *t, size_t n, dcp_htab_key_fn keyof,
                      const void *arr);

/* Frees t's slots and empties it; the caller's array is not touched. */
void dcp__htab_release(struct dcp_htab *t);

#endif /* DCP_HASHTAB_H */
