/*
 * JSON: a bounded parser for the small JSON documents of the safetensors
 * format (a file's header, model.safetensors.index.json), which are hostile
 * input. RFC 8259 grammar, strictly: no comments, no trailing commas, no
 * leading zeros, no control characters or invalid UTF-8 in strings, no
 * lone surrogates in \u escapes. Depth and node count are bounded. Object
 * members keep their order; duplicate keys are left for the caller to
 * refuse (dcp__json_dup_key finds them).
 */
#ifndef DCP_JSON_H
#define DCP_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum json_kind {
    JSON_NULL = 0,
    JSON_BOOL,
    JSON_NUM,
    JSON_STR,
    JSON_ARR,
    JSON_OBJ
};

struct json_node {
    uint8_t kind;   /* enum json_kind */
    uint8_t is_int; /* JSON_NUM: an integer that fits int64 (i is valid) */
    int b;          /* JSON_BOOL */
    int64_t i;      /* JSON_NUM with is_int */
    const char *s;  /* JSON_STR: decoded UTF-8, NUL-terminated */
    size_t len;     /* JSON_STR: bytes; JSON_ARR: items; JSON_OBJ: members */
    struct json_node **v; /* JSON_ARR: items; JSON_OBJ: key0, val0, ... */
    size_t off;           /* byte offset of the value in the document */
};

struct json_doc;

/*
 * Parses p[0..len) as one JSON value (whitespace around it allowed).
 * max_depth bounds nesting, max_nodes the values created. On success *doc
 * owns every node (dcp__json_free) and *root is the value. Returns DCP_OK,
 * DCP_EFORMAT (malformed; the message names the byte offset), DCP_ELIMIT,
 * DCP_ENOMEM.
 */
int dcp__json_parse(const char *p, size_t len, size_t max_depth, size_t max_nodes,
               struct json_doc **doc, struct json_node **root,
               struct dcp_err *err);
void dcp__json_free(struct json_doc *doc);

/* Member of an object by key (the first one), or NULL. */
const struct json_node *dcp__json_get(const struct json_node *obj, const char *key);

/* The key of member i of an object. */
static inline const struct json_node *json_key(const struct json_node *obj,
                                               size_t i)
{
    return obj->v[2 * i];
}
static inline const struct json_node *json_val(const struct json_node *obj,
                                               size_t i)
{
    return obj->v[2 * i + 1];
}

/* A key that occurs twice in obj, or NULL. O(n log n). */
const char *dcp__json_dup_key(const struct json_node *obj);

/* Appends s[0..n) as a JSON string literal (quotes and escapes) to b. */
int dcp__json_put_str(struct dcp_buf *b, const char *s, size_t n);

#endif /* DCP_JSON_H */
