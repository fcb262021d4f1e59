/*
 * The unflattened layout (torch's flatten_state_dict=False, docs/FORMAT.md
 * §9.4): a top-level nested dict or list is one value entry whose record is
 * torch.save of the container, tensors inside. Its leaves become entries
 * of their own, named as torch's flatten_state_dict names them.
 */
#ifndef DCP_UNFLAT_H
#define DCP_UNFLAT_H

#include "meta.h"
#include "util.h"

/*
 * For every value entry of md without planner_data whose record holds
 * storages (an uncompressed record), reads its data.pkl (never executing
 * anything, nested.h) and replaces the entry with one entry per leaf:
 * "<key>.<leaf path>", a tensor entry of one chunk covering its shape or a
 * value entry, both reading the same record (md_entry.member). A value
 * whose pickle holds a hostile or unreadable tensor or leaf stays one
 * value entry, with the error a read of it returns (md_entry.bad:
 * DCP_EFORMAT naming key and member, DCP_ENOTSUP, DCP_ELIMIT). A record
 * that cannot be read or decoded at all is left as it is (a read reports
 * why). path: the checkpoint directory. Returns DCP_OK, or DCP_ENOMEM.
 */
int dcp__uf_expand(const char *path, struct dcp_metadata *md,
                   struct dcp_err *err);

/* Whether md has a value entry dcp__uf_expand would open (the same answer
 * on every rank that decoded the same .metadata). */
int dcp__uf_candidates(const struct dcp_metadata *md);

#endif /* DCP_UNFLAT_H */
