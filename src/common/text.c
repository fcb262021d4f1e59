/*
 * Text: one UTF-8 validator for the whole library (the pickle decoder
 * accepts surrogates as CPython does; a save refuses them, and NUL), and
 * the escaping of keys and names for error messages, so that a message
 * naming a bad key is itself printable text on one line.
 */
#include "text.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid sequence at s[0..n) (n >= 1), or 0 if none. */
static size_t seq_len(const uint8_t *s, size_t n, unsigned flags)
{
    size_t k, i;
    if (s[0] < 0x80)
        return s[0] == 0 && (flags & DCP__UTF8_NO_NUL) ? 0 : 1;
    if (s[0] < 0xc2 || s[0] > 0xf4)
        return 0; /* a continuation byte, an overlong lead, beyond U+10FFFF */
    k = s[0] < 0xe0 ? 1 : s[0] < 0xf0 ? 2 : 3;
    if (n <= k)
        return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    if (s[0] == 0xed && s[1] > 0x9f && !(flags & DCP__UTF8_SURROGATES))
        return 0;
    for (i = 1; i <= k; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return k + 1;
}

size_t dcp__utf8_check(const void *p, size_t n, unsigned flags)
{
    const uint8_t *s = p;
    size_t i = 0, k;
    uint64_t w;
    while (i < n) {
        if (n - i >= 8) {
            memcpy(&w, s + i, 8);
            /* Eight ASCII bytes; with NO_NUL, none of them zero. */
            if (!(w & 0x8080808080808080ULL) &&
                (!(flags & DCP__UTF8_NO_NUL) ||
                 !((w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL))) {
                i += 8;
                continue;
            }
        }
        k = seq_len(s + i, n - i, flags);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

/* The escaped form of the character at s[i] into tmp (8 bytes); its
 * length, with *k the bytes of s it stands for. */
static size_t piece(const uint8_t *s, size_t n, size_t i, char *tmp, size_t *k)
{
    *k = seq_len(s + i, n - i, 0);
    if (*k > 1) {
        memcpy(tmp, s + i, *k);
        return *k;
    }
    *k = 1;
    switch (s[i]) {
    case '\\':
        memcpy(tmp, "\\\\", 2);
        return 2;
    case '\n':
        memcpy(tmp, "\\n", 2);
        return 2;
    case '\t':
        memcpy(tmp, "\\t", 2);
        return 2;
    case '\r':
        memcpy(tmp, "\\r", 2);
        return 2;
    default:
        break;
    }
    if (s[i] < 0x20 || s[i] >= 0x7f) {
        (void)snprintf(tmp, 8, "\\x%02x", s[i]);
        return 4;
    }
    tmp[0] = (char)s[i];
    return 1;
}

char *dcp__text_escape(char *out, size_t cap, const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i, o = 0, k, t, total = 0;
    char tmp[8];
    for (i = 0; i < n && total < cap; i += k)
        total += piece(u, n, i, tmp, &k);
    for (i = 0; i < n; i += k) {
        t = piece(u, n, i, tmp, &k);
        /* Unless the whole fits, keep room for "..." and its NUL; o + 4 <=
         * cap always holds here. */
        if (total >= cap && o + t + 4 > cap) {
            memcpy(out + o, "...", 4);
            return out;
        }
        memcpy(out + o, tmp, t);
        o += t;
    }
    out[o] = '\0';
    return out;
}
