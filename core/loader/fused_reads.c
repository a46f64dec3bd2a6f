/*
 * Positioned reads that put checkpoint bytes where they belong in one pass: widened to float32 on the way
 * (a bfloat16 or float16 file loaded as float32), or scattered row by row (a row-parallel shard: every row's
 * slice of one rank).
 *
 * Compiled on first use by loader/_fused_reads.py (plain C, called through ctypes, which leaves the GIL) and
 * cached per machine; without a compiler the Python paths (a bounce buffer and a torch or numpy copy) do the
 * same work with one more pass over the bytes.
 *
 * Why not a memory map: another process may truncate a checkpoint while it loads, and touching a mapped page
 * past the new end is a SIGBUS that kills the process. pread/preadv return short instead, and the caller turns
 * the short count into an error naming the file. So these functions never map the file:
 *   - widening reads pread a piece small enough to stay in the core's cache, then convert it into the
 *     destination: the bytes leave the page cache once and are written once, at their final width;
 *   - gathers hand preadv one iovec per row slice, pointing into the destination, and one per gap, all
 *     pointing into one small scratch buffer, so the kernel copies the kept slices straight into place.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

int loader_fused_reads_abi(void) { return 1; }

enum { SOURCE_BFLOAT16 = 1, SOURCE_FLOAT16 = 2 };

/* The widening scratch: 128 KiB of source stays in L2 while it is converted. */
#define WIDEN_PIECE_BYTES (128 << 10)

/* IEEE half to single, exact; signed zeros and NaN payloads kept, a signalling NaN quieted (as the x86 F16C
 * conversion torch uses does). */
static uint32_t half_to_single_bits(uint16_t half) {
    uint32_t sign = (uint32_t)(half & 0x8000u) << 16;
    uint32_t exponent = (half >> 10) & 0x1fu;
    uint32_t mantissa = half & 0x3ffu;
    if (exponent == 0x1f) {
        return sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u);
    }
    if (exponent == 0) {
        if (mantissa == 0) {
            return sign;
        }
        int shift = 0;
        while (!(mantissa & 0x400u)) {
            mantissa <<= 1;
            shift++;
        }
        return sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3ffu) << 13);
    }
    return sign | ((exponent + 112u) << 23) | (mantissa << 13);
}

static void widen(const uint16_t *source, int kind, uint32_t *out, int64_t count) {
    if (kind == SOURCE_BFLOAT16) {
        for (int64_t i = 0; i < count; i++) {
            out[i] = (uint32_t)source[i] << 16;
        }
    } else {
        for (int64_t i = 0; i < count; i++) {
            out[i] = half_to_single_bits(source[i]);
        }
    }
}

/* Read count 2-byte values from byte offset of fd and write them widened to float32 at out (little-endian
 * host). Returns the values written: count, fewer when the file ends first, or -errno. */
int64_t loader_read_widening(int fd, int64_t offset, int64_t count, int kind, void *out) {
    if (kind != SOURCE_BFLOAT16 && kind != SOURCE_FLOAT16) {
        return -EINVAL;
    }
    uint16_t *piece = malloc(WIDEN_PIECE_BYTES);
    if (piece == NULL) {
        return -ENOMEM;
    }
    const int64_t per_piece = WIDEN_PIECE_BYTES / 2;
    int64_t done = 0;
    while (done < count) {
        int64_t want = count - done < per_piece ? count - done : per_piece;
        int64_t have = 0; /* bytes of this piece read */
        while (have < want * 2) {
            ssize_t got = pread(fd, (char *)piece + have, (size_t)(want * 2 - have), (off_t)(offset + done * 2 + have));
            if (got < 0) {
                if (errno == EINTR) {
                    continue;
                }
                int error = errno;
                free(piece);
                return -error;
            }
            if (got == 0) {
                break;
            }
            have += got;
        }
        int64_t values = have / 2;
        widen(piece, kind, (uint32_t *)out + done, values);
        done += values;
        if (values < want) {
            break;
        }
    }
    free(piece);
    return done;
}

/* Finish rows [first, rows) one pread per slice after a short preadv (a signal, or the file's end). */
static int64_t gather_slowly(int fd, int64_t offset, int64_t first, int64_t rows, int64_t row_stride,
                             int64_t segment, char *out) {
    for (int64_t row = first; row < rows; row++) {
        int64_t have = 0;
        while (have < segment) {
            ssize_t got = pread(fd, out + row * segment + have, (size_t)(segment - have),
                                (off_t)(offset + row * row_stride + have));
            if (got < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return -errno;
            }
            if (got == 0) {
                return row;
            }
            have += got;
        }
    }
    return rows;
}

/* Read rows slices of segment bytes, row_stride apart from byte offset of fd, into out (rows * segment bytes,
 * packed). Returns the rows read whole: rows, fewer when the file ends first, or -errno. */
int64_t loader_read_gather(int fd, int64_t offset, int64_t rows, int64_t row_stride, int64_t segment, void *out) {
    if (segment <= 0 || row_stride < segment) {
        return -EINVAL;
    }
    const int64_t gap = row_stride - segment;
    char *scratch = gap > 0 ? malloc((size_t)gap) : NULL;
    if (gap > 0 && scratch == NULL) {
        return -ENOMEM;
    }
    const int64_t per_call = gap > 0 ? IOV_MAX / 2 : IOV_MAX;
    struct iovec *iov = malloc(sizeof(struct iovec) * (size_t)(2 * per_call));
    if (iov == NULL) {
        free(scratch);
        return -ENOMEM;
    }
    int64_t row = 0;
    int64_t result = rows;
    while (row < rows) {
        int64_t block = rows - row < per_call ? rows - row : per_call;
        int count = 0;
        for (int64_t i = 0; i < block; i++) {
            iov[count].iov_base = (char *)out + (row + i) * segment;
            iov[count].iov_len = (size_t)segment;
            count++;
            if (gap > 0 && i + 1 < block) {
                iov[count].iov_base = scratch;
                iov[count].iov_len = (size_t)gap;
                count++;
            }
        }
        int64_t want = (block - 1) * row_stride + segment;
        ssize_t got = preadv(fd, iov, count, (off_t)(offset + row * row_stride));
        if (got < 0 && errno != EINTR) {
            result = -errno;
            break;
        }
        if (got != want) { /* short: let single reads find which rows are whole, or where the file ends */
            int64_t whole = got > 0 ? got / row_stride : 0;
            result = gather_slowly(fd, offset, row + whole, rows, row_stride, segment, out);
            break;
        }
        row += block;
    }
    free(iov);
    free(scratch);
    return result;
}
