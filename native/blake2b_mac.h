/* Keyed BLAKE2b with a salt (RFC 7693), for the session MAC of every frame
 * (common/auth.py FrameMac). Python's hashlib.blake2b(key=..., salt=..., digest_size=...)
 * computes the same function; tests/test_auth.py holds this one to it. Written from the RFC:
 * the parameter block's first word carries the digest and key lengths (fan-out and depth 1),
 * words 4 and 5 the salt; a key is one zero-padded block before the message.
 *
 * Header-only: static functions, included by common/_wire.pyx. */
#ifndef CAIRN_BLAKE2B_MAC_H
#define CAIRN_BLAKE2B_MAC_H

#include <stdint.h>
#include <string.h>

#define CAIRN_BLAKE2B_BLOCK 128
#define CAIRN_BLAKE2B_KEY_MAX 64

typedef struct {
    uint64_t h[8];
    uint64_t t[2];                  /* bytes compressed so far, 128 bits */
    unsigned char buf[CAIRN_BLAKE2B_BLOCK];
    size_t buflen;
} cairn_blake2b_state;

static const uint64_t cairn_blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL,
    0xa54ff53a5f1d36f1ULL, 0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL,
    0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

static const uint8_t cairn_blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

static inline uint64_t cairn_rotr64(uint64_t x, unsigned n) {
    return (x >> n) | (x << (64 - n));
}

static inline uint64_t cairn_load64_le(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);               /* x86-64 and aarch64 Linux: little-endian */
    return v;
}

#define CAIRN_B2_G(a, b, c, d, x, y)            \
    do {                                        \
        v[a] = v[a] + v[b] + (x);               \
        v[d] = cairn_rotr64(v[d] ^ v[a], 32);   \
        v[c] = v[c] + v[d];                     \
        v[b] = cairn_rotr64(v[b] ^ v[c], 24);   \
        v[a] = v[a] + v[b] + (y);               \
        v[d] = cairn_rotr64(v[d] ^ v[a], 16);   \
        v[c] = v[c] + v[d];                     \
        v[b] = cairn_rotr64(v[b] ^ v[c], 63);   \
    } while (0)

#define CAIRN_B2_ROUND(r)                                                                \
    do {                                                                                 \
        CAIRN_B2_G(0, 4, 8, 12, m[cairn_blake2b_sigma[r][0]], m[cairn_blake2b_sigma[r][1]]);   \
        CAIRN_B2_G(1, 5, 9, 13, m[cairn_blake2b_sigma[r][2]], m[cairn_blake2b_sigma[r][3]]);   \
        CAIRN_B2_G(2, 6, 10, 14, m[cairn_blake2b_sigma[r][4]], m[cairn_blake2b_sigma[r][5]]);  \
        CAIRN_B2_G(3, 7, 11, 15, m[cairn_blake2b_sigma[r][6]], m[cairn_blake2b_sigma[r][7]]);  \
        CAIRN_B2_G(0, 5, 10, 15, m[cairn_blake2b_sigma[r][8]], m[cairn_blake2b_sigma[r][9]]);  \
        CAIRN_B2_G(1, 6, 11, 12, m[cairn_blake2b_sigma[r][10]], m[cairn_blake2b_sigma[r][11]]); \
        CAIRN_B2_G(2, 7, 8, 13, m[cairn_blake2b_sigma[r][12]], m[cairn_blake2b_sigma[r][13]]);  \
        CAIRN_B2_G(3, 4, 9, 14, m[cairn_blake2b_sigma[r][14]], m[cairn_blake2b_sigma[r][15]]);  \
    } while (0)

static void cairn_blake2b_compress(cairn_blake2b_state *s, const unsigned char *block,
                                   int last) {
    uint64_t m[16], v[16];
    int i;
    for (i = 0; i < 16; i++)
        m[i] = cairn_load64_le(block + 8 * i);
    for (i = 0; i < 8; i++) {
        v[i] = s->h[i];
        v[i + 8] = cairn_blake2b_iv[i];
    }
    v[12] ^= s->t[0];
    v[13] ^= s->t[1];
    if (last)
        v[14] = ~v[14];
    /* Rounds unrolled with literal indices: the compiler folds the schedule into register
     * choices (a loop over sigma's rows measured twice as slow). */
    CAIRN_B2_ROUND(0); CAIRN_B2_ROUND(1); CAIRN_B2_ROUND(2); CAIRN_B2_ROUND(3);
    CAIRN_B2_ROUND(4); CAIRN_B2_ROUND(5); CAIRN_B2_ROUND(6); CAIRN_B2_ROUND(7);
    CAIRN_B2_ROUND(8); CAIRN_B2_ROUND(9); CAIRN_B2_ROUND(10); CAIRN_B2_ROUND(11);
    for (i = 0; i < 8; i++)
        s->h[i] ^= v[i] ^ v[i + 8];
}

static inline void cairn_blake2b_count(cairn_blake2b_state *s, uint64_t n) {
    s->t[0] += n;
    if (s->t[0] < n)
        s->t[1]++;
}

/* Start a keyed hash of `outlen` bytes (1..64) with a 16-byte salt given as two
 * little-endian words; keylen 1..64. */
static void cairn_blake2b_init(cairn_blake2b_state *s, size_t outlen, const unsigned char *key,
                               size_t keylen, uint64_t salt_lo, uint64_t salt_hi) {
    int i;
    for (i = 0; i < 8; i++)
        s->h[i] = cairn_blake2b_iv[i];
    s->h[0] ^= 0x01010000ULL ^ ((uint64_t)keylen << 8) ^ (uint64_t)outlen;
    s->h[4] ^= salt_lo;
    s->h[5] ^= salt_hi;
    s->t[0] = s->t[1] = 0;
    memset(s->buf, 0, sizeof s->buf);
    memcpy(s->buf, key, keylen);
    s->buflen = CAIRN_BLAKE2B_BLOCK;
}

static void cairn_blake2b_update(cairn_blake2b_state *s, const unsigned char *in, size_t n) {
    while (n > 0) {
        size_t take;
        if (s->buflen == CAIRN_BLAKE2B_BLOCK) {     /* more follows: not the last block */
            cairn_blake2b_count(s, CAIRN_BLAKE2B_BLOCK);
            cairn_blake2b_compress(s, s->buf, 0);
            s->buflen = 0;
        }
        take = CAIRN_BLAKE2B_BLOCK - s->buflen;
        if (take > n)
            take = n;
        memcpy(s->buf + s->buflen, in, take);
        s->buflen += take;
        in += take;
        n -= take;
    }
}

static void cairn_blake2b_final(cairn_blake2b_state *s, unsigned char *out, size_t outlen) {
    unsigned char bytes[64];
    cairn_blake2b_count(s, s->buflen);
    memset(s->buf + s->buflen, 0, CAIRN_BLAKE2B_BLOCK - s->buflen);
    cairn_blake2b_compress(s, s->buf, 1);
    memcpy(bytes, s->h, sizeof bytes);                   /* little-endian words */
    memcpy(out, bytes, outlen);
}

/* The frame MAC: keyed BLAKE2b-`outlen` of a || b, salted with the frame counter. */
static void cairn_frame_mac(const unsigned char *key, size_t keylen, uint64_t counter,
                            const unsigned char *a, size_t alen, const unsigned char *b,
                            size_t blen, unsigned char *out, size_t outlen) {
    cairn_blake2b_state s;
    cairn_blake2b_init(&s, outlen, key, keylen, counter, 0);
    cairn_blake2b_update(&s, a, alen);
    cairn_blake2b_update(&s, b, blen);
    cairn_blake2b_final(&s, out, outlen);
}

#endif
