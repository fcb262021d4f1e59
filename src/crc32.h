/*
 * CRC-32 (ISO-HDLC, the zip polynomial 0xEDB88320, reflected), as zip and
 * torch.save record it. Table-driven, slicing-by-8; a carry-less-multiply
 * version may replace the body without changing the interface.
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

/* Copies n bytes from src to dst and returns the CRC continued over them. */
uint32_t dcp__crc32_copy(uint32_t crc, void *dst, const void *src, size_t n);

#endif /* DCP_CRC32_H */
