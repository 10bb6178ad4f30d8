/* crc32c (Castagnoli) of each fixed-size block of a buffer.
 *
 * The store keeps one crc32c per 4 KiB block. Calling the crc32c package once per block from
 * Python costs ~0.6 ms per 4 MiB object (a profile of `cairn bench store --op put` put it at 21%
 * of the run), so the loop lives here. Blocks are independent, so three are checksummed at once:
 * the crc32 instruction has a latency of 3 cycles and a throughput of 1, and three independent
 * chains keep it busy without the combine step a single-stream 3-way split needs.
 *
 * The SSE4.2 path is chosen at run time; other CPUs use a table-driven loop (the same results,
 * slower). Standard CRC-32C: initial value and final xor 0xFFFFFFFF.
 */
#ifndef CAIRN_CRC32C_BLOCKS_H
#define CAIRN_CRC32C_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint32_t cairn_crc32c_table[256];
static int cairn_crc32c_table_ready = 0;

static void cairn_crc32c_init_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;
        cairn_crc32c_table[n] = c;
    }
    cairn_crc32c_table_ready = 1;
}

static uint32_t cairn_crc32c_sw(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = cairn_crc32c_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t cairn_crc32c_hw_one(const unsigned char *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) { uint64_t v; memcpy(&v, p + k, 8); c = _mm_crc32_u64(c, v); }
    uint32_t c32 = (uint32_t)c;
    for (; k < n; k++) c32 = _mm_crc32_u8(c32, p[k]);
    return ~c32;
}

__attribute__((target("sse4.2")))
static void cairn_crc32c_blocks_hw(const unsigned char *p, size_t block, size_t count,
                                   uint32_t *out) {
    size_t i = 0;
    if (block % 8 == 0) {
        for (; i + 3 <= count; i += 3) {
            const unsigned char *a = p + i * block, *b = a + block, *c = b + block;
            uint64_t ca = 0xFFFFFFFFu, cb = 0xFFFFFFFFu, cc = 0xFFFFFFFFu;
            for (size_t k = 0; k < block; k += 8) {
                uint64_t va, vb, vc;
                memcpy(&va, a + k, 8); memcpy(&vb, b + k, 8); memcpy(&vc, c + k, 8);
                ca = _mm_crc32_u64(ca, va); cb = _mm_crc32_u64(cb, vb); cc = _mm_crc32_u64(cc, vc);
            }
            out[i] = ~(uint32_t)ca; out[i + 1] = ~(uint32_t)cb; out[i + 2] = ~(uint32_t)cc;
        }
    }
    for (; i < count; i++) out[i] = cairn_crc32c_hw_one(p + i * block, block);
}

static int cairn_crc32c_hw_available(void) { return __builtin_cpu_supports("sse4.2"); }
#else
static void cairn_crc32c_blocks_hw(const unsigned char *p, size_t block, size_t count,
                                   uint32_t *out) { (void)p; (void)block; (void)count; (void)out; }
static int cairn_crc32c_hw_available(void) { return 0; }
#endif

/* Folding block crcs into the crc of their concatenation, without the bytes. For this crc,
 * crc(A || B) = Z(crc(A)) ^ crc(B), where Z advances the crc register over len(B) zero bytes;
 * Z is linear over GF(2), so for blocks of one fixed size it is four byte-indexed tables. A
 * payload checked this way is read once for both its frame checksum and the store's per-block
 * ones. */
static uint32_t cairn_crc32c_zeros[4][256];

static void cairn_crc32c_init_zeros(size_t block) {
    uint32_t basis[32];
    if (!cairn_crc32c_table_ready) cairn_crc32c_init_table();
    for (int i = 0; i < 32; i++) {
        uint32_t c = 1u << i;
        for (size_t k = 0; k < block; k++) c = cairn_crc32c_table[c & 0xFF] ^ (c >> 8);
        basis[i] = c;
    }
    for (int j = 0; j < 4; j++) {
        for (int b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int i = 0; i < 8; i++) if ((b >> i) & 1) v ^= basis[8 * j + i];
            cairn_crc32c_zeros[j][b] = v;
        }
    }
}

/* The crc of `count` blocks (of the size given to cairn_crc32c_init_zeros) after bytes whose
 * crc is `crc`, from the blocks' own crcs. */
static uint32_t cairn_crc32c_fold(uint32_t crc, const uint32_t *crcs, size_t count) {
    for (size_t i = 0; i < count; i++) {
        crc = cairn_crc32c_zeros[0][crc & 0xFF] ^ cairn_crc32c_zeros[1][(crc >> 8) & 0xFF] ^
              cairn_crc32c_zeros[2][(crc >> 16) & 0xFF] ^ cairn_crc32c_zeros[3][crc >> 24] ^
              crcs[i];
    }
    return crc;
}

/* crc32c of `n` bytes continuing from `crc` (a crc already computed over what came before:
 * the `value` argument of checksum.crc32c). */
#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t cairn_crc32c_update_hw(uint32_t crc, const unsigned char *p, size_t n) {
    uint64_t c = ~crc;
    size_t k = 0;
    for (; k + 8 <= n; k += 8) { uint64_t v; memcpy(&v, p + k, 8); c = _mm_crc32_u64(c, v); }
    uint32_t c32 = (uint32_t)c;
    for (; k < n; k++) c32 = _mm_crc32_u8(c32, p[k]);
    return ~c32;
}
#else
static uint32_t cairn_crc32c_update_hw(uint32_t crc, const unsigned char *p, size_t n) {
    (void)p; (void)n; return crc;
}
#endif

static uint32_t cairn_crc32c_update(uint32_t crc, const unsigned char *p, size_t n, int hw) {
    if (hw) return cairn_crc32c_update_hw(crc, p, n);
    if (!cairn_crc32c_table_ready) cairn_crc32c_init_table();
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; i++) c = cairn_crc32c_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return ~c;
}

static void cairn_crc32c_blocks(const unsigned char *p, size_t block, size_t count,
                                uint32_t *out, int hw) {
    if (hw) { cairn_crc32c_blocks_hw(p, block, count, out); return; }
    if (!cairn_crc32c_table_ready) cairn_crc32c_init_table();
    for (size_t i = 0; i < count; i++) out[i] = cairn_crc32c_sw(p + i * block, block);
}

#endif
