/*
 * Save-time text checks. A key or str that is not valid UTF-8 would be
 * written (pickle stores bytes) and then refused by every reader, dcp's
 * and Python's, so a save refuses it first, naming the key. The state's
 * add functions take keys as they come (they have no context to explain
 * a refusal in); this is the one place the rule is applied.
 */
#include "keycheck.h"

#include <string.h>

#include "text.h"

#define SHOW_MAX 200

static int bad_key(const struct st_entry *e, size_t at, struct dcp_err *err)
{
    char show[SHOW_MAX];
    (void)dcp__text_escape(show, sizeof(show), e->key, strlen(e->key));
    return dcp__err(err, DCP_EINVAL,
                    "key '%s' is not valid UTF-8 (bad byte at offset %zu): "
                    "keys must be UTF-8 text without NUL",
                    show, at);
}

/* The first str in v (a dict key or an item, depth first) that is not
 * valid UTF-8, with the offset of its first bad byte; NULL if none. */
static const dcp_value *bad_str(const dcp_value *v, int depth, size_t *at)
{
    size_t i;
    if (depth > 64)
        return NULL; /* deeper values are refused by the pickle writer */
    switch (v->type) {
    case DCP_VALUE_STR:
        *at = dcp__utf8_check(v->u.s.p, v->u.s.len, DCP__TEXT_VALUE);
        return *at < v->u.s.len ? v : NULL;
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
    case DCP_VALUE_DICT:
        for (i = 0; i < v->u.seq.n; i++) {
            const dcp_value *b = bad_str(v->u.seq.v[i], depth + 1, at);
            if (b)
                return b;
        }
        return NULL;
    case DCP_VALUE_NONE:
    case DCP_VALUE_BOOL:
    case DCP_VALUE_INT:
    case DCP_VALUE_FLOAT:
    case DCP_VALUE_BYTES:
        return NULL;
    }
    return NULL;
}

int dcp__state_check_text(const dcp_state *st, struct dcp_err *err)
{
    size_t i, at;
    if (!st)
        return DCP_OK;
    for (i = 0; i < st->n; i++) {
        const struct st_entry *e = &st->e[i];
        const dcp_value *b;
        size_t n = strlen(e->key);
        at = dcp__utf8_check(e->key, n, DCP__TEXT_KEY);
        if (at < n)
            return bad_key(e, at, err);
        b = e->value ? bad_str(e->value, 0, &at) : NULL;
        if (b) {
            char show[SHOW_MAX], sv[SHOW_MAX];
            (void)dcp__text_escape(show, sizeof(show), e->key, n);
            (void)dcp__text_escape(sv, sizeof(sv), b->u.s.p, b->u.s.len);
            return dcp__err(err, DCP_EINVAL,
                            "key '%s': str \"%s\" in its value is not valid "
                            "UTF-8 (bad byte at offset %zu)",
                            show, sv, at);
        }
    }
    return DCP_OK;
}
