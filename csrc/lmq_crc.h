/* lmq_crc.h: CRC-32 of zlib (gzip / ISO-HDLC: reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF),
 * the BODYCRC of RocketMQ CommitLog records (masked there with 0x7FFFFFFF by the caller).
 *
 * Contract: these functions cannot fail and never touch errno. lmq_crc32(crc, buf, len) returns exactly what
 * zlib.crc32(buf, crc) / zlib's crc32_z(crc, buf, len) return: lmq_crc32(0, p, n) is the CRC of p[0..n), and
 * lmq_crc32(lmq_crc32(0, a, na), b, nb) is the CRC of a followed by b. buf may be NULL when len is 0 (the CRC is
 * returned unchanged). Any alignment; any length (size_t, no 4 GiB limit). Thread-safe, no allocation.
 *
 * lmq_crc32 uses PCLMULQDQ folding on x86-64 CPUs that have it (checked once, at the first call) and a portable
 * slice-by-8 table implementation otherwise; setting LOCALMQ_CRC=portable in the environment before the first
 * call forces the portable one. lmq_crc32_portable is always the portable one (tests compare both).
 */
#ifndef LMQ_CRC_H
#define LMQ_CRC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint32_t lmq_crc32(uint32_t crc, const void *buf, size_t len);
uint32_t lmq_crc32_portable(uint32_t crc, const void *buf, size_t len);
/* 1 when lmq_crc32 uses the accelerated (PCLMULQDQ) implementation, else 0. */
int lmq_crc32_accelerated(void);

#ifdef __cplusplus
}
#endif

#endif
