/*
 * The read-once load: a stored tensor chunk that several ranks need is
 * read (and verified) by one of them and forwarded to the others over the
 * communicator's point-to-point operations (dcp_comm.h, version 2).
 *
 * Who reads what. Every rank marks the chunks its boxes overlap (one byte
 * per chunk of the checkpoint, in .metadata order); rank 0 gathers the
 * marks and broadcasts them, and every rank computes the same plan from
 * them: a chunk is shared when two or more ranks need it; the shared
 * chunks, in storage order (file, offset), are cut into as many slices of
 * about equal bytes as there are ranks, and rank r reads those whose
 * middle lies in slice r when it needs them (so a reader's records are
 * neighbours: merged requests on S3, sequential reads on files), else the
 * rank that needs the chunk with the fewest bytes to read so far (its own
 * chunks included). Chunks one rank needs are read by it as before.
 *
 * How the bytes move. A reader takes its shared chunks in .metadata order
 * (on S3 hinted whole first, a round at a time, fetched together):
 * it reads the whole chunk through dcp__rd_chunk (verified: block CRCs or
 * the record's CRC), straight into its own buffer when the chunk lands
 * there whole and contiguous, else into a staging buffer; then it posts,
 * to every rank that needs it, a 16-byte header (the outcome: DCP_OK or
 * the reader's error code) and, on success, the chunk's C-contiguous
 * elements in the stored dtype in pieces of at most RO_PIECE bytes,
 * nonblocking, and goes on reading the next chunk while they travel (at
 * most RO_HELD bytes of staging held by sends in flight). A receiver
 * posts the headers it expects (in the same order, per reader) and, when
 * one says DCP_OK, the pieces, straight into its buffer when the chunk
 * lands there whole and contiguous, else into a buffer copied (and cast)
 * into its boxes when the last piece arrives. A failed header makes the
 * receiver drop the chunk without touching its buffers; the reader's own
 * code and message then reach every rank through the agreement that ends
 * the load. After a failure a reader reads nothing more and sends failed
 * headers for its remaining chunks, so every message posted is matched.
 */
#ifndef DCP_READONCE_H
#define DCP_READONCE_H

#include "ctx.h"
#include "read.h"
#include "state.h"

/* struct ro_plan is in ctx.h (a load plan cache keeps one). */

/*
 * Plans the reads of st (this rank's request, checked against md).
 * Collective. With DCP_LOAD_PER_RANK_READS on any rank, a communicator
 * without point-to-point operations, one rank, or more than 256 MiB of
 * marks (ranks x chunks), p->on is 0 and every rank reads its own
 * chunks. With DCP_LOAD_SMALL_PER_RANK on any rank (gathered with the
 * marks), a chunk under DCP_READ_ONCE_SMALL bytes is not shared: every
 * rank that needs it reads it. Every rank returns the same code.
 *
 * rc is this rank's outcome of the load's steps before, agreed in the
 * same allreduce as the plan's first step (dcp__comm_agree_stage: theirs
 * stage 0, the plan's own failures stage 1, in *failed_stage, which may
 * be NULL); skip, the same on every rank where they succeeded, ends the
 * load there: nothing is planned. With rc failed or skip set, one
 * agreement and nothing else.
 */
int dcp__ro_plan(dcp_ctx *ctx, const dcp_state *st,
                 const struct dcp_metadata *md, unsigned flags, int rc,
                 int skip, struct ro_plan *p, int *failed_stage);

/*
 * 1 when the plan p (made by dcp__ro_plan for md) serves a load of st with
 * flags on this rank: st's marks are those p was planned with. A plan
 * made on every rank from the same marks is the plan dcp__ro_plan would
 * make again (load.c's plan cache: each rank checks its own marks and the
 * ranks agree). 0 also when out of memory. Local.
 */
int dcp__ro_same(const struct ro_plan *p, const dcp_state *st,
                 const struct dcp_metadata *md, unsigned flags);

/* Whether chunk ci of entry ei is read once (and so skipped by the
 * per-rank reads). */
static inline int dcp__ro_shared(const struct ro_plan *p, size_t ei, size_t ci)
{
    return p && p->on && p->reader[p->base[ei] + ci] >= 0;
}

/*
 * Reads the shared chunks this rank is reader of and forwards them;
 * receives the ones it needs from their readers. local_rc is this rank's
 * outcome so far (a failed rank reads nothing more, but still answers
 * every message). Returns local_rc, this rank's read error, or a
 * transport failure. Adds the tensor bytes read to *bytes_read and those
 * received to *bytes_recv; *dropped is set when a reader failed and a
 * chunk this rank needs did not land (the load fails on every rank). On a
 * back end that takes hints (S3) the chunks this rank reads are hinted
 * whole in rounds of about hint_round bytes (held until the next round).
 * Point-to-point only (no collective call): what it needs was allocated
 * and agreed on with the plan (p's jobs, reset here, so that a plan kept
 * by the load plan cache runs again).
 */
int dcp__ro_run(dcp_ctx *ctx, struct ro_plan *p, const dcp_state *st,
                struct rd_files *f, const struct dcp_metadata *md, int verify,
                int local_rc, uint64_t hint_round, uint64_t *bytes_read,
                uint64_t *bytes_recv, int *dropped);

void dcp__ro_release(struct ro_plan *p);

#endif /* DCP_READONCE_H */
