/*
 * Text: UTF-8 validation (the pickle decoder's rule and the stricter rule
 * for what dcp writes) and the escaping of untrusted text (keys, file
 * names) for error messages.
 */
#ifndef DCP_TEXT_H
#define DCP_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* dcp__utf8_valid flags. */
enum {
    /* Accept encoded surrogates (U+D800..U+DFFF), as CPython's
     * "surrogatepass" error handler does when it unpickles a str. */
    DCP__UTF8_SURROGATES = 1 << 0,
    /* Refuse U+0000 (a NUL byte). */
    DCP__UTF8_NO_NUL = 1 << 1
};

/*
 * Length of the longest well-formed UTF-8 prefix of s[0..n): n when the
 * whole is valid, else the offset of the first byte that starts no valid
 * character (an overlong form, beyond U+10FFFF, a truncated sequence, an
 * encoded surrogate unless DCP__UTF8_SURROGATES, a NUL with
 * DCP__UTF8_NO_NUL).
 */
size_t dcp__utf8_check(const void *s, size_t n, unsigned flags);

/* 1 if s[0..n) is well-formed UTF-8 under flags, else 0. */
static inline int dcp__utf8_valid(const void *s, size_t n, unsigned flags)
{
    return dcp__utf8_check(s, n, flags) == n;
}

/*
 * What a save writes as a key or a key's path component: well-formed UTF-8
 * without NUL or surrogates, which dcp and Python both read back. (A str
 * value may hold NUL: Python's str does, and both round-trip it.)
 */
#define DCP__TEXT_KEY   DCP__UTF8_NO_NUL
#define DCP__TEXT_VALUE 0u

/*
 * Copies s[0..n) into out (capacity cap >= 4, always NUL-terminated) for a
 * message: valid multi-byte characters are kept, a backslash becomes
 * "\\", newline, tab and carriage return "\n", "\t", "\r", and any other
 * control character (C0, DEL) or byte that is not part of a valid
 * character "\xNN". A result that does not fit ends in "...". Returns out.
 */
char *dcp__text_escape(char *out, size_t cap, const char *s, size_t n);

#endif /* DCP_TEXT_H */
