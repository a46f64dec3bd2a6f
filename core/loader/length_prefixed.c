/*
 * Walk an array of length-prefixed records (a little-endian uint64 byte count, then that many bytes): where it
 * ends, without reading the records.
 *
 * Compiled on first use by loader/_length_prefixed.py (plain C, called through ctypes) and cached per machine;
 * the Python loop there computes the same answer and is used when no compiler is found.
 *
 * Why: a GGUF header holds its vocabulary and merges this way (SmolLM2: 98,052 strings before the tensor
 * table). Finding the table's start in a Python loop took most of the header's parse time.
 */
#include <stdint.h>
#include <string.h>

int loader_records_abi(void) { return 1; }

/* From byte pos of buf (size bytes), step over up to count records. Returns the records wholly inside the
 * buffer (count when all are) and sets *end to the byte after the last of them. */
int64_t loader_u64_prefixed_end(const uint8_t *buf, int64_t size, int64_t pos, int64_t count, int64_t *end) {
    int64_t done = 0;
    while (done < count && size - pos >= 8) {
        uint64_t length;
        memcpy(&length, buf + pos, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        length = __builtin_bswap64(length);
#endif
        if (length > (uint64_t)(size - pos - 8)) {
            break;
        }
        pos += 8 + (int64_t)length;
        done++;
    }
    *end = pos;
    return done;
}
