/*
 * CRC-32 (ISO-HDLC, the zip polynomial 0xEDB88320, reflected), as zip and
 * torch.save record it. Carry-less multiplication (PCLMULQDQ, or VPCLMULQDQ
 * with AVX2 or AVX-512) where the CPU has it, slicing-by-8 tables
 * otherwise. Thread safe.
 */
#ifndef DCP_CRC32_H
#define DCP_CRC32_H

#include <stddef.h>
#include <stdint.h>

/*
 * Continues a CRC: start with crc = 0, feed pieces in order; the result of
 * the last call is the CRC of the concatenation. dcp__crc32(0, "123456789",
 * 9) == 0xCBF43926.
 */
uint32_t dcp__crc32(uint32_t crc, const void *p, size_t n);

/* Copies n bytes from src to dst and returns the CRC continued over them,
 * in one pass over the data (the checksum is fused with the copy). src and
 * dst must not overlap. */
uint32_t dcp__crc32_copy(uint32_t crc, void *dst, const void *src, size_t n);

/*
 * The CRC of the concatenation A B from crc1 = CRC(A), crc2 = CRC(B) and
 * len2 = |B| (zlib's crc32_combine), without the data: a few hundred
 * operations.
 */
uint32_t dcp__crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/*
 * Per-block CRCs of a stream of bytes fed in pieces of any size: the CRC of
 * every bsize bytes (the last block may be shorter) goes to crc[0..max),
 * and the CRC of the whole stream is derived from them (crc32_combine), so
 * every byte is hashed once. bsize 0: no blocks, only the whole CRC (cur).
 */
struct crc_blocks {
    uint64_t bsize; /* bytes per block; 0: one unbounded block */
    uint32_t xb;    /* x^(8 bsize) mod P: combines a whole block (0: not
                       computed yet; it is never 0) */
    uint32_t whole; /* CRC of the blocks completed so far */
    uint32_t cur;   /* CRC of the block being filled */
    uint64_t fill;  /* its bytes so far */
    uint64_t total; /* bytes fed */
    uint32_t *crc;  /* the caller's array of max block CRCs */
    size_t n, max;  /* blocks completed; a block past max is not stored
                       (the caller sized crc from the length) */
};

/* Starts a stream; crc (max entries) may be NULL when bsize is 0. */
void dcp__crcb_init(struct crc_blocks *b, uint64_t bsize, uint32_t *crc,
                    size_t max);
/* Feeds n bytes at p; with dst, copies them there too (dcp__crc32_copy). */
void dcp__crcb_update(struct crc_blocks *b, void *dst, const void *p,
                      size_t n);
/* Appends a block whose CRC is already known (len bytes, len <= bsize,
 * only the last one shorter), without data: checks a list of block CRCs
 * against a whole CRC. Not mixed with dcp__crcb_update. */
void dcp__crcb_add_block(struct crc_blocks *b, uint32_t crc, uint64_t len);
/* Closes the last (partial) block and returns the whole stream's CRC;
 * b->n is then the number of blocks, ceil(total / bsize). */
uint32_t dcp__crcb_finish(struct crc_blocks *b);

/*
 * Tests and benchmarks: caps the implementation at max_level (0 tables,
 * 1 PCLMUL, 2 VPCLMUL on 256-bit registers (AVX2), 3 VPCLMUL on 512-bit
 * ones (AVX-512); a negative value leaves the cap alone) and returns
 * the level now in use on this CPU. Not thread safe: call it while no CRC
 * is being computed.
 */
int dcp__crc32_impl(int max_level);

#endif /* DCP_CRC32_H */
