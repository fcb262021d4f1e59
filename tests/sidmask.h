/*
 * For tests that compare the bytes of two saves of the same state: every
 * save writes its own random save id into each record's save-id extra
 * field (docs/FORMAT.md §4: ID 0x4953 "SI", u16 length, u16 version 1,
 * the id), so two saves' data files differ exactly there. This replaces
 * each such id by '0's; the rest of the bytes must still be equal. A
 * false match inside tensor data is masked alike in both files (the same
 * bytes at the same place), so equality is not weakened.
 */
#ifndef DCP_TEST_SIDMASK_H
#define DCP_TEST_SIDMASK_H

#include <stddef.h>
#include <string.h>

static size_t dcp_test_mask_sids(unsigned char *p, size_t n)
{
    size_t i, k = 0;
    for (i = 0; i + 6 <= n; i++) {
        size_t len;
        if (p[i] != 0x53 || p[i + 1] != 0x49 || p[i + 4] != 1 || p[i + 5])
            continue;
        len = (size_t)p[i + 2] | ((size_t)p[i + 3] << 8);
        if (len < 3 || len - 2 > 64 || len > n - i - 4)
            continue;
        memset(p + i + 6, '0', len - 2);
        k++;
        i += 3 + len;
    }
    return k;
}

#endif /* DCP_TEST_SIDMASK_H */
