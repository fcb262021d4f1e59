/*
 * The text rule a save enforces before it plans anything: every key is
 * UTF-8 without NUL, every str inside a value UTF-8 (see text.h), so that
 * what dcp writes, dcp and torch can read back.
 */
#ifndef DCP_KEYCHECK_H
#define DCP_KEYCHECK_H

#include "state.h"

/*
 * Checks every entry of st: its key (the path components joined) and, for
 * a value, every str in it (dict keys included). Returns DCP_OK or
 * DCP_EINVAL with a message naming the key, escaped ("\xff"), and the
 * offset of the first bad byte.
 */
int dcp__state_check_text(const dcp_state *st, struct dcp_err *err);

#endif /* DCP_KEYCHECK_H */
