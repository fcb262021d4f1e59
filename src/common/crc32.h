/*
 * CRC-32 (ISO-HDLC, the zip polynomial 0xEDB88320, reflected), as zip and
 * torch.save record it. Carry-less multiplication (PCLMULQDQ, or VPCLMULQDQ
 * with AVX-512) where the CPU has it, slicing-by-8 tables otherwise. Thread
 * safe.
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
 * Tests and benchmarks: caps the implementation at max_level (0 tables,
 * 1 PCLMUL, 2 VPCLMUL; a negative value leaves the cap alone) and returns
 * the level now in use on this CPU. Not thread safe: call it while no CRC
 * is being computed.
 */
int dcp__crc32_impl(int max_level);

#endif /* DCP_CRC32_H */
