/* kscales.h - internal: unpacking the K-quants' packed sub-block scales, four bytes at a time.
 * Shared by the SIMD kernel files; the layouts are described in types.h and quants_ref.c. */
#ifndef RM_CPU_KSCALES_H
#define RM_CPU_KSCALES_H

#include <stdint.h>
#include <string.h>

/* Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins from 12 bytes. Bytes 0-3 hold scales 0-3
 * and bytes 4-7 mins 0-3 (low 6 bits); bytes 8-11 the low nibbles of scale (low) and min (high)
 * 4-7, whose top 2 bits are the top 2 bits of bytes 0-3 and 4-7. */
static inline void rm_unpack_scales_k4(const uint8_t q[12], uint8_t sc[8], uint8_t mn[8]) {
    uint32_t u[3], s[2], m[2];
    memcpy(u, q, 12);
    s[0] = u[0] & 0x3f3f3f3f;
    m[0] = u[1] & 0x3f3f3f3f;
    s[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);
    m[1] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4);
    memcpy(sc, s, 8);
    memcpy(mn, m, 8);
}

/* Q3_K: sixteen 6-bit scales stored + 32, as levels 0..63 (subtract 32 for the scale). Low
 * nibbles of 0-7 in bytes 0-7, of 8-15 in their high nibbles; the top 2 bits of scale j sit in
 * byte 8 + j % 4 at bit 2 * (j / 4). */
static inline void rm_unpack_scales_q3_K(const uint8_t q[12], uint8_t sc[16]) {
    uint32_t u[3], s[4];
    memcpy(u, q, 12);
    s[0] = (u[0] & 0x0f0f0f0f) | (((u[2] >> 0) & 0x03030303) << 4);
    s[1] = (u[1] & 0x0f0f0f0f) | (((u[2] >> 2) & 0x03030303) << 4);
    s[2] = ((u[0] >> 4) & 0x0f0f0f0f) | (((u[2] >> 4) & 0x03030303) << 4);
    s[3] = ((u[1] >> 4) & 0x0f0f0f0f) | (((u[2] >> 6) & 0x03030303) << 4);
    memcpy(sc, s, 16);
}

#endif
