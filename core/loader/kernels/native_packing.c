/*
 * Byte shuffles that turn 4-bit / 8-bit checkpoint blocks into torch's packed int4 CPU layout.
 *
 * Compiled on first use by loader/kernels/native_packing.py (plain C, no Python or torch headers, called
 * through ctypes) and cached per machine; every function here has a torch implementation that computes the
 * same bytes (loader/kernels/int8_cpu.py, and the GGUF plugin's half-split packer), which is used when no
 * compiler is found and which the tests compare against, byte for byte.
 *
 * Why: each of these is a transpose of bytes (rows of a checkpoint become torch's [K, block_n / 2] tiles)
 * followed by nibble arithmetic. torch runs the transpose as a strided element-by-element copy and the
 * arithmetic as several passes over memory; here a 16 x 16 byte tile is transposed in registers and the
 * nibbles are combined while it is still in cache, once.
 *
 * Layout (torch 2.13, see int4_layout.pack_codes_bytes): rows in blocks of block_n; block b is stored as
 * [K, block_n / 2] bytes whose byte (k, j) holds row j's code in its low nibble and row j + block_n / 2's
 * in its high one. Only whole blocks are handled here; the callers pack a last partial block themselves.
 */
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) && !defined(LOADER_REPACK_SCALAR)
#include <emmintrin.h>
#define LOADER_REPACK_SSE2 1
#else
#define LOADER_REPACK_SSE2 0
#endif

#define MAX_HALF 32 /* block_n / 2 for block_n 64 (AVX-512 builds) or 32 (AVX2) */

int loader_repack_abi(void) { return 4; }

int loader_repack_simd(void) { return LOADER_REPACK_SSE2; }

/* Byte offsets of rows first .. first + count - 1 from src: row r at rows[r] * row_stride when a row order is
 * given (the rows of a part in its layer's order, e.g. llama.cpp's q/k rows un-interleaved), else r * row_stride. */
static void row_offsets(const int64_t *rows, int64_t row_stride, int64_t first, int count, int64_t *at) {
    for (int j = 0; j < count; j++) at[j] = (rows ? rows[first + j] : first + j) * row_stride;
}

/* out[p][j] = base[at[j] + p] for 16 columns p and `count` rows j (a multiple of 16). */
static void gather_columns(const uint8_t *base, const int64_t *at, int count, uint8_t out[16][MAX_HALF]) {
#if LOADER_REPACK_SSE2
    for (int j0 = 0; j0 < count; j0 += 16) {
        __m128i x[16], y[16];
        for (int i = 0; i < 16; i++) x[i] = _mm_loadu_si128((const __m128i *)(base + at[j0 + i]));
        /* four rounds of interleaving rows i and i + 8 transpose a 16 x 16 byte tile */
        for (int round = 0; round < 4; round++) {
            for (int i = 0; i < 8; i++) {
                y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
                y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
            }
            memcpy(x, y, sizeof(x));
        }
        for (int p = 0; p < 16; p++) _mm_storeu_si128((__m128i *)(out[p] + j0), x[p]);
    }
#else
    for (int j = 0; j < count; j++)
        for (int p = 0; p < 16; p++) out[p][j] = base[at[j] + p];
#endif
}

/*
 * Q4_0 / Q4_1 codes (16 bytes a group of 32 columns: column p low, p + 16 high) into torch's layout.
 * src: row r, group g at src + r * row_stride + g * group_stride; blocks * block_n rows, `groups` groups;
 * rows (NULL: in order) lists the source row of each output row. dst: blocks * groups * 32 * block_n / 2 bytes.
 */
void loader_int4pack_half_split(const uint8_t *src, const int64_t *rows, int64_t row_stride, int64_t group_stride,
                                int64_t blocks, int64_t groups, int64_t block_n, uint8_t *dst) {
    const int half = (int)(block_n / 2);
    const int64_t k = groups * 32;
    uint8_t lo[16][MAX_HALF], hi[16][MAX_HALF];
    int64_t first[MAX_HALF], second[MAX_HALF];
    for (int64_t b = 0; b < blocks; b++) {
        row_offsets(rows, row_stride, b * block_n, half, first);
        row_offsets(rows, row_stride, b * block_n + half, half, second);
        uint8_t *block = dst + b * k * half;
        for (int64_t g = 0; g < groups; g++) {
            gather_columns(src + g * group_stride, first, half, lo);
            gather_columns(src + g * group_stride, second, half, hi);
            uint8_t *low_columns = block + g * 32 * half;   /* columns g * 32 + p */
            uint8_t *high_columns = low_columns + 16 * half; /* columns g * 32 + 16 + p */
            for (int p = 0; p < 16; p++) {
                for (int j = 0; j < half; j++) {
                    low_columns[p * half + j] = (uint8_t)((lo[p][j] & 0x0F) | (hi[p][j] << 4));
                    high_columns[p * half + j] = (uint8_t)((lo[p][j] >> 4) | (hi[p][j] & 0xF0));
                }
            }
        }
    }
}

/*
 * Int8 codes (32 bytes a group) into two int4 planes of torch's layout (int8_cpu.py): the high plane
 * (code >> 4, arithmetic, + 8) in the first blocks * block_n rows' bytes, the low plane (code & 15) after it.
 * src as above with 32-byte groups; dst: 2 * blocks * groups * 32 * block_n / 2 bytes.
 */
void loader_int8_planes(const uint8_t *src, int64_t row_stride, int64_t group_stride, int64_t blocks,
                        int64_t groups, int64_t block_n, uint8_t *dst) {
    const int half = (int)(block_n / 2);
    const int64_t k = groups * 32;
    uint8_t *low_plane = dst + blocks * block_n * k / 2;
    uint8_t f[16][MAX_HALF], s[16][MAX_HALF]; /* rows j and j + half of a block, by column */
    int64_t first[MAX_HALF], second[MAX_HALF];
    for (int64_t b = 0; b < blocks; b++) {
        row_offsets(NULL, row_stride, b * block_n, half, first);
        row_offsets(NULL, row_stride, b * block_n + half, half, second);
        for (int64_t g = 0; g < groups; g++) {
            for (int part = 0; part < 2; part++) { /* the group's columns 0-15, then 16-31 */
                const int64_t offset = g * group_stride + part * 16;
                gather_columns(src + offset, first, half, f);
                gather_columns(src + offset, second, half, s);
                const int64_t at = b * k * half + (g * 32 + part * 16) * half;
                for (int p = 0; p < 16; p++) {
                    for (int j = 0; j < half; j++) {
                        dst[at + p * half + j] = (uint8_t)(((f[p][j] >> 4) | (s[p][j] & 0xF0)) ^ 0x88);
                        low_plane[at + p * half + j] = (uint8_t)((f[p][j] & 0x0F) | (s[p][j] << 4));
                    }
                }
            }
        }
    }
}

/* float16 -> float32, exact and without branches on the value (so loops over it vectorize): the float16 bits
 * moved into float32's place are the value times 2^-112 (a float32 subnormal when the float16 is one), so one
 * exact multiplication by 2^112 rebiases the exponent; infinities and NaNs get the all-ones exponent back. */
static inline float half_bits_to_float(uint16_t h) {
    const uint32_t magnitude = (uint32_t)(h & 0x7FFF) << 13;
    float value;
    memcpy(&value, &magnitude, 4);
    value *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits |= ((h & 0x7C00) == 0x7C00) ? 0x7F800000u : 0u;
    bits |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&value, &bits, 4);
    return value;
}

/* torch's float -> bfloat16 (c10::round_to_nearest_even), branch-free: NaN becomes 0x7FC0. */
static inline uint16_t float_to_bfloat16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, 4);
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    return (uint16_t)(((bits & 0x7FFFFFFFu) > 0x7F800000u) ? 0x7FC0u : rounded);
}

#define SCALE_TILE 64

/*
 * Torch's bfloat16 scales and zeros [groups, dst_rows, 2] (w = (q - 8) s + z) for rows
 * row_offset .. row_offset + count from each block's leading float16 fields: Q4_0 (has_min 0: s = d, z = 0)
 * or Q4_1 (s = d, z = m + 8 d in float32, rounded once). src: row r, group g's block at
 * src + r * row_stride + g * group_stride; rows (NULL: in order) lists the source row of each output row.
 */
void loader_q4_scales_bf16(const uint8_t *src, const int64_t *rows, int64_t row_stride, int64_t group_stride,
                           int64_t count_rows, int64_t groups, int has_min, uint16_t *dst, int64_t dst_rows,
                           int64_t row_offset) {
    /* 64 rows at a time: their blocks stay in cache across the groups; each group's fields are gathered
     * into a short array, converted by a loop the compiler vectorizes, and written as one contiguous run */
    uint16_t d[SCALE_TILE], m[SCALE_TILE];
    uint16_t pairs[2 * SCALE_TILE];
    int64_t at[SCALE_TILE];
    for (int64_t first = 0; first < count_rows; first += SCALE_TILE) {
        const int count = (int)(count_rows - first < SCALE_TILE ? count_rows - first : SCALE_TILE);
        row_offsets(rows, row_stride, first, count, at);
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *group = src + g * group_stride;
            for (int j = 0; j < count; j++) {
                memcpy(&d[j], group + at[j], 2); /* little-endian, as GGUF stores it */
                if (has_min) memcpy(&m[j], group + at[j] + 2, 2);
                else m[j] = 0;
            }
            for (int j = 0; j < count; j++) {
                const float scale = half_bits_to_float(d[j]);
                pairs[2 * j] = float_to_bfloat16(scale);
                pairs[2 * j + 1] = has_min ? float_to_bfloat16(half_bits_to_float(m[j]) + 8.0f * scale) : 0;
            }
            memcpy(dst + (g * dst_rows + row_offset + first) * 2, pairs, (size_t)count * 4);
        }
    }
}

/*
 * 4-bit codes packed eight to a 32-bit word (GPTQ, AWQ, compressed-tensors) straight into torch's layout, every
 * code unpacked in registers (no byte per code in memory). Code (k, n) of the weight (k: input feature, n: output
 * feature) is (word >> shifts[i]) & 15 of the word at
 *   along_n == 0 (packed along the input: GPTQ [K/8, N], compressed-tensors [N, K/8]):
 *       words[(k / 8) * k_stride + n * n_stride], i = k % 8;
 *   along_n == 1 (packed along the output: AWQ [K, N/8]): words[k * k_stride + (n / 8) * n_stride], i = n % 8.
 * Strides are in words. n is a multiple of 16 and k of 8; the rows past the last whole block of block_n (a
 * multiple of 16) are stored as [K, T / 2] bytes pairing adjacent rows, as torch does. dst: n * k / 2 bytes.
 */
static inline uint8_t nibble(uint32_t word, int shift) { return (uint8_t)((word >> shift) & 15u); }

static void words_along_k(const uint32_t *words, int64_t k_stride, int64_t n_stride, const uint8_t *shifts,
                          int64_t first, int64_t second, int64_t pairs, int64_t step, int64_t k, uint8_t *dst) {
    /* output byte (kk, j) = code(kk, first + j * step) | code(kk, second + j * step) << 4 for j < pairs */
    uint32_t lo[MAX_HALF], hi[MAX_HALF];
    for (int64_t k8 = 0; k8 < k / 8; k8++) {
        const uint32_t *row = words + k8 * k_stride;
        for (int64_t j = 0; j < pairs; j++) {
            lo[j] = row[(first + j * step) * n_stride];
            hi[j] = row[(second + j * step) * n_stride];
        }
        for (int i = 0; i < 8; i++) {
            uint8_t *out = dst + (k8 * 8 + i) * pairs;
            const int shift = shifts[i];
            for (int64_t j = 0; j < pairs; j++) out[j] = (uint8_t)(nibble(lo[j], shift) | (nibble(hi[j], shift) << 4));
        }
    }
}

static void words_along_n(const uint32_t *words, int64_t k_stride, int64_t n_stride, const uint8_t *shifts,
                          int64_t first, int64_t second, int64_t pairs, int64_t step, int64_t k, uint8_t *dst) {
    for (int64_t kk = 0; kk < k; kk++) {
        const uint32_t *row = words + kk * k_stride;
        uint8_t *out = dst + kk * pairs;
        for (int64_t j = 0; j < pairs; j++) {
            const int64_t a = first + j * step, b = second + j * step;
            out[j] = (uint8_t)(nibble(row[(a >> 3) * n_stride], shifts[a & 7]) |
                               (nibble(row[(b >> 3) * n_stride], shifts[b & 7]) << 4));
        }
    }
}

void loader_int4pack_words(const uint32_t *words, int64_t k_stride, int64_t n_stride, int along_n,
                           const uint8_t *shifts, int64_t n, int64_t k, int64_t block_n, uint8_t *dst) {
    const int64_t half = block_n / 2, full = n / block_n * block_n;
    for (int64_t b = 0; b < full / block_n; b++) {
        const int64_t first = b * block_n;
        uint8_t *out = dst + b * k * half;
        if (along_n) words_along_n(words, k_stride, n_stride, shifts, first, first + half, half, 1, k, out);
        else words_along_k(words, k_stride, n_stride, shifts, first, first + half, half, 1, k, out);
    }
    /* the tail pairs adjacent rows, at most (block_n - 16) / 2 pairs: within MAX_HALF */
    const int64_t tail_pairs = (n - full) / 2;
    if (tail_pairs) {
        uint8_t *out = dst + full * k / 2;
        if (along_n) words_along_n(words, k_stride, n_stride, shifts, full, full + 1, tail_pairs, 2, k, out);
        else words_along_k(words, k_stride, n_stride, shifts, full, full + 1, tail_pairs, 2, k, out);
    }
}

/*
 * Q4_K codes (a 256-column super-block holds four runs of 32 bytes; byte p of run i holds column 64 i + p in its
 * low nibble and 64 i + 32 + p in its high one) into torch's layout. src: row r, super-block s's codes at
 * src + r * row_stride + s * block_stride; rows (NULL: in order) as for loader_int4pack_half_split.
 * dst: blocks * superblocks * 256 * block_n / 2 bytes.
 */
void loader_int4pack_q4_k(const uint8_t *src, const int64_t *rows, int64_t row_stride, int64_t block_stride,
                          int64_t blocks, int64_t superblocks, int64_t block_n, uint8_t *dst) {
    const int half = (int)(block_n / 2);
    const int64_t k = superblocks * 256;
    uint8_t lo[16][MAX_HALF], hi[16][MAX_HALF];
    int64_t first[MAX_HALF], second[MAX_HALF];
    for (int64_t b = 0; b < blocks; b++) {
        row_offsets(rows, row_stride, b * block_n, half, first);
        row_offsets(rows, row_stride, b * block_n + half, half, second);
        uint8_t *block = dst + b * k * half;
        for (int64_t s = 0; s < superblocks; s++) {
            for (int run = 0; run < 8; run++) { /* 16 bytes at a time: run / 2 is the 32-byte run, run % 2 its half */
                const int64_t offset = s * block_stride + run * 16;
                gather_columns(src + offset, first, half, lo);
                gather_columns(src + offset, second, half, hi);
                const int64_t column = s * 256 + (run / 2) * 64 + (run % 2) * 16;
                uint8_t *low_columns = block + column * half;          /* columns column + p */
                uint8_t *high_columns = low_columns + 32 * half;        /* columns column + 32 + p */
                for (int p = 0; p < 16; p++) {
                    for (int j = 0; j < half; j++) {
                        low_columns[p * half + j] = (uint8_t)((lo[p][j] & 0x0F) | (hi[p][j] << 4));
                        high_columns[p * half + j] = (uint8_t)((lo[p][j] >> 4) | (hi[p][j] & 0xF0));
                    }
                }
            }
        }
    }
}

/*
 * Torch's scales and zeros [groups, dst_rows, 2] (w = (q - 8) s + z) for rows row_offset .. row_offset + count of
 * Q4_K super-blocks (d, dmin: float16; twelve bytes of eight 6-bit scales sc and mins m; 8 groups of 32):
 * s = d sc, z = -(dmin m) + 8 s in float32 (the products are exact, z is rounded once), stored as bfloat16
 * (bf16 != 0) or float32. src: row r, super-block s at src + r * row_stride + s * block_stride.
 */
void loader_q4_k_scales(const uint8_t *src, const int64_t *rows, int64_t row_stride, int64_t block_stride,
                        int64_t count_rows, int64_t superblocks, int bf16, void *dst, int64_t dst_rows,
                        int64_t row_offset) {
    int64_t at[SCALE_TILE];
    for (int64_t first = 0; first < count_rows; first += SCALE_TILE) {
        const int count = (int)(count_rows - first < SCALE_TILE ? count_rows - first : SCALE_TILE);
        row_offsets(rows, row_stride, first, count, at);
        for (int64_t s = 0; s < superblocks; s++) {
            for (int j = 0; j < count; j++) {
                const uint8_t *block = src + at[j] + s * block_stride;
                uint16_t d_bits, m_bits;
                memcpy(&d_bits, block, 2);
                memcpy(&m_bits, block + 2, 2);
                const float d = half_bits_to_float(d_bits), dmin = half_bits_to_float(m_bits);
                const uint8_t *q = block + 4;
                for (int g = 0; g < 8; g++) {
                    const int sc = g < 4 ? (q[g] & 63) : ((q[g + 4] & 0x0F) | ((q[g - 4] >> 6) << 4));
                    const int mn = g < 4 ? (q[g + 4] & 63) : ((q[g + 4] >> 4) | ((q[g] >> 6) << 4));
                    const float scale = d * (float)sc;
                    const float zero = -(dmin * (float)mn) + 8.0f * scale;
                    const int64_t out = ((s * 8 + g) * dst_rows + row_offset + first + j) * 2;
                    if (bf16) {
                        ((uint16_t *)dst)[out] = float_to_bfloat16(scale);
                        ((uint16_t *)dst)[out + 1] = float_to_bfloat16(zero);
                    } else {
                        ((float *)dst)[out] = scale;
                        ((float *)dst)[out + 1] = zero;
                    }
                }
            }
        }
    }
}
