/* Core of the zstd frame index (see _zstdindex.c): plain C, no Python API, so that a
 * standalone harness (fuzzers, sanitizers) can build it. The includer defines ZI_MALLOC,
 * ZI_REALLOC and ZI_FREE.
 *
 * Random access into one zstd frame without holding its window.
 *
 * A zstd frame (RFC 8878) is a list of blocks; a compressed block is literals plus sequences,
 * each sequence "copy LL literals, then copy ML bytes from OFFSET bytes back". Decoding the
 * entropy layer (Huffman literals, FSE sequence codes) yields that list; the bytes themselves
 * are never needed to know it. This module decodes the entropy layer once, keeps one record per
 * sequence (where its output starts, its lengths, its offset, where its literals are), and then
 * serves any byte range by walking each match back to the literals it copies. Memory is the
 * records and the literals (about 8 MB for a 113 MB jax bundle), never the window (the whole
 * bundle there: clang's bundler compresses with long-distance matching).
 *
 * Written from RFC 8878; every length, offset and table read from the input is checked against
 * what the input and the format allow. Two limits come from the caller: records (sequences can
 * cost no input bits at all, so their number is not bounded by the input) and resolution steps
 * per read. Past either, the failure says so (Fail.too_large) and the caller reads the frame
 * another way.
 */
#ifndef ROCM_AUDIT_ZSTDINDEX_CORE_H
#define ROCM_AUDIT_ZSTDINDEX_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define BLOCK_MAX (128u << 10)          /* RFC 8878 3.1.1.2.4: Block_Maximum_Size */
#define LIT_RLE_FLAG 0x80000000u        /* record.lit: all literals are lits[lit & ~flag] */
#define LL_MAX_SYMBOL 35
#define ML_MAX_SYMBOL 52
#define OF_MAX_SYMBOL 31
#define LL_MAX_LOG 9
#define ML_MAX_LOG 9
#define OF_MAX_LOG 8
#define HUF_MAX_LOG 11
#define HUF_WEIGHTS_MAX_LOG 6

/* ---------------------------------------------------------------- errors */

typedef struct {
    size_t offset;
    const char *reason;
    int too_large;
} Fail;

#define FAIL(f, off, why) do { (f)->offset = (off); (f)->reason = (why); return -1; } while (0)

/* ---------------------------------------------------------------- records */

typedef struct {
    uint64_t start;      /* output position of the first literal */
    uint32_t lit_len;
    uint32_t match_len;
    uint32_t offset;     /* match distance; 0 when match_len is 0 */
    uint32_t lit;        /* index into lits, or LIT_RLE_FLAG | index of the repeated byte */
} Record;

#define SAMPLE_SHIFT 4  /* every 16th record's start is kept apart, for find_record() */
/* table[k] is the last record starting at or before output byte k << TABLE_SHIFT: a read's lookup
 * is one load and a step or two forward instead of a binary search missing the cache at every
 * level (82 ns a lookup on jax's bundles, 27 ns this way; per 64 bytes: no faster, per 1024:
 * 10% slower). Real bundles have about one record per 320 output bytes, so the table is about a
 * sixth of the records' memory; it holds at most `max` entries (the records' own limit), since an
 * RLE block makes 128 KiB of output from 4 input bytes: past that, lookups search. */
#define TABLE_SHIFT 8

typedef struct {
    Record *rec;
    size_t n, cap, max;
    uint64_t *sample;  /* sample[k] = rec[k << SAMPLE_SHIFT].start: a small array to search first */
    size_t nsample, samplecap;
    uint32_t *table;   /* see TABLE_SHIFT: filled for the output decoded so far (table_fill) */
    size_t ntable, tablecap;
    uint8_t *lits;
    size_t nlits, litcap, maxlits;
} Index;

static int grow_records(Index *ix, Fail *f, size_t at);

/* Double an array's room (`first` elements the first time, never past `max`); -1 when out of memory. */
static int grow_array(void **array, size_t *cap, size_t size, size_t first, size_t max) {
    size_t want = *cap ? *cap * 2 : first;
    if (want > max)
        want = max;
    if (want <= *cap || want > SIZE_MAX / size)
        return -1;
    void *grown = ZI_REALLOC(*array, want * size);
    if (!grown)
        return -1;
    *array = grown;
    *cap = want;
    return 0;
}

static inline int push_record(Index *ix, Fail *f, size_t at, uint64_t start, uint32_t ll, uint32_t ml,
                       uint32_t off, uint32_t lit) {
    if (ll == 0 && ml == 0)
        return 0;
    if (ix->n == ix->cap && grow_records(ix, f, at) < 0)
        return -1;
    if (!(ix->n & ((1u << SAMPLE_SHIFT) - 1))) {
        if (ix->nsample == ix->samplecap &&
            grow_array((void **)&ix->sample, &ix->samplecap, sizeof(uint64_t), 1024, SIZE_MAX) < 0) {
            f->too_large = 1;
            FAIL(f, at, "out of memory for the index");
        }
        ix->sample[ix->nsample++] = start;
    }
    Record *r = &ix->rec[ix->n++];
    r->start = start;
    r->lit_len = ll;
    r->match_len = ml;
    r->offset = off;
    r->lit = lit;
    return 0;
}

static int grow_records(Index *ix, Fail *f, size_t at) {
    if (ix->n >= ix->max) {
        f->too_large = 1;
        FAIL(f, at, "more sequences than the index may hold");
    }
    if (grow_array((void **)&ix->rec, &ix->cap, sizeof(Record), 4096, ix->max) < 0) {
        f->too_large = 1;
        FAIL(f, at, "out of memory for the index");
    }
    return 0;
}

/* Room for `extra` more literal bytes; returns where they go. */
static uint8_t *grow_lits(Index *ix, Fail *f, size_t at, size_t extra) {
    if (extra > ix->maxlits - ix->nlits) {
        f->too_large = 1;
        f->offset = at;
        f->reason = "more literals than the index may hold";
        return NULL;
    }
    if (ix->nlits + extra > ix->litcap || !ix->lits) {  /* allocated even for none: dst is never NULL */
        size_t cap = ix->litcap ? ix->litcap : (64u << 10);
        while (cap < ix->nlits + extra)
            cap *= 2;
        if (cap > ix->maxlits)
            cap = ix->maxlits;
        uint8_t *p = ZI_REALLOC(ix->lits, cap);
        if (!p) {
            f->too_large = 1;
            f->offset = at;
            f->reason = "out of memory for the literals";
            return NULL;
        }
        ix->lits = p;
        ix->litcap = cap;
    }
    uint8_t *dst = ix->lits + ix->nlits;
    ix->nlits += extra;
    return dst;
}

/* ---------------------------------------------------------------- backward bitstream (RFC 4.1) */

typedef struct {
    const uint8_t *start;
    size_t len;
    int64_t pos;    /* bits not yet read; negative once the stream is overread */
    int64_t wbase;  /* `word` holds stream bits [wbase, wbase + 64) */
    uint64_t word;
} BackBits;

static inline uint64_t load_le(const uint8_t *start, size_t len, size_t at) {
    uint64_t v = 0;
    if (at + 8 <= len) {
        memcpy(&v, start + at, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
#endif
        return v;
    }
    for (size_t k = 0; at + k < len && k < 8; k++)
        v |= (uint64_t)start[at + k] << (8 * k);
    return v;
}

static int back_init(BackBits *b, const uint8_t *start, size_t len) {
    if (len == 0 || start[len - 1] == 0)
        return -1;  /* the last byte holds the end mark */
    unsigned top = 7;
    while (!(start[len - 1] >> top & 1))
        top--;
    b->start = start;
    b->len = len;
    b->pos = (int64_t)(len - 1) * 8 + top;
    b->wbase = INT64_MAX / 2;  /* nothing loaded */
    b->word = 0;
    return 0;
}

/* The n <= 32 bits below `end` (stream bit index); bits before the stream's start read as zeros
 * (the format's overread rule). Reads go backwards, so a reload puts `end` at the word's top. */
static inline uint32_t back_bits(BackBits *b, int64_t end, unsigned n) {
    int64_t p = end - n;
    uint64_t mask = (1ull << n) - 1;
    if (p >= b->wbase && end <= b->wbase + 64)
        return (uint32_t)((b->word >> (p - b->wbase)) & mask);
    if (p < 0) {
        if (end <= 0)
            return 0;
        return (uint32_t)((load_le(b->start, b->len, 0) << (unsigned)(-p)) & mask);
    }
    int64_t byte = end > 64 ? (end - 57) >> 3 : 0;  /* word covers at least 57 bits below end */
    b->wbase = byte * 8;
    b->word = load_le(b->start, b->len, (size_t)byte);
    return (uint32_t)((b->word >> (p - b->wbase)) & mask);
}

static inline uint32_t back_read(BackBits *b, unsigned n) {
    if (n == 0)
        return 0;
    uint32_t v = back_bits(b, b->pos, n);
    b->pos -= n;
    return v;
}

static inline uint32_t back_peek(BackBits *b, unsigned n) {
    return back_bits(b, b->pos, n);
}

/* ---------------------------------------------------------------- FSE (RFC 4.1) */

typedef struct {
    uint8_t symbol;
    uint8_t bits;
    uint16_t base;
} FseCell;

typedef struct {
    FseCell cell[1 << LL_MAX_LOG];  /* the largest accuracy any table here may use */
    unsigned log;
    int ready;
} FseTable;

/* Normalized counts -> decoding table. norm[s] is -1 for "less than 1". */
static int fse_build(FseTable *t, const int16_t *norm, unsigned nsym, unsigned log) {
    unsigned size = 1u << log, high = size - 1;
    uint16_t next[256];
    for (unsigned s = 0; s < nsym; s++) {
        if (norm[s] == -1) {
            t->cell[high--].symbol = (uint8_t)s;
            next[s] = 1;
        } else {
            next[s] = (uint16_t)norm[s];
        }
    }
    unsigned step = (size >> 1) + (size >> 3) + 3, mask = size - 1, pos = 0;
    for (unsigned s = 0; s < nsym; s++) {
        for (int k = 0; k < norm[s]; k++) {
            t->cell[pos].symbol = (uint8_t)s;
            do
                pos = (pos + step) & mask;
            while (pos > high);
        }
    }
    if (pos != 0)
        return -1;
    for (unsigned u = 0; u < size; u++) {
        unsigned s = t->cell[u].symbol, n = next[s]++;
        unsigned hb = 31 - (unsigned)__builtin_clz(n);
        unsigned bits = log - hb;
        t->cell[u].bits = (uint8_t)bits;
        t->cell[u].base = (uint16_t)((n << bits) - size);
    }
    t->log = log;
    t->ready = 1;
    return 0;
}

static void fse_rle(FseTable *t, uint8_t symbol) {
    t->cell[0].symbol = symbol;
    t->cell[0].bits = 0;
    t->cell[0].base = 0;
    t->log = 0;
    t->ready = 1;
}

/* Forward little-endian bitstream of a table description (RFC 4.1.1). */
static int fse_read_table(FseTable *t, const uint8_t *src, size_t len, size_t *used, unsigned max_log,
                          unsigned max_symbol) {
    int16_t norm[256];
    size_t bitpos = 0, total = len * 8;
#define PEEK(n) ((unsigned)((load_le(src, len, bitpos >> 3) >> (bitpos & 7)) & ((1u << (n)) - 1)))
    if (total < 4)
        return -1;
    unsigned log = PEEK(4) + 5;
    bitpos += 4;
    if (log > max_log)
        return -1;
    int remaining = (1 << log) + 1, threshold = 1 << log;
    unsigned nbits = log + 1, nsym = 0;
    int prev0 = 0;
    while (remaining > 1 && nsym <= max_symbol) {
        if (prev0) {
            unsigned r;
            do {
                if (bitpos + 2 > total)
                    return -1;
                r = PEEK(2);
                bitpos += 2;
                for (unsigned k = 0; k < r; k++) {
                    if (nsym > max_symbol)
                        return -1;
                    norm[nsym++] = 0;
                }
            } while (r == 3);
            if (nsym > max_symbol)
                break;
        }
        int max = 2 * threshold - 1 - remaining;
        unsigned v = PEEK(nbits);
        int count;
        if ((int)(v & (unsigned)(threshold - 1)) < max) {
            count = (int)(v & (unsigned)(threshold - 1));
            bitpos += nbits - 1;
        } else {
            count = (int)(v & (unsigned)(2 * threshold - 1));
            if (count >= threshold)
                count -= max;
            bitpos += nbits;
        }
        if (bitpos > total)
            return -1;
        count--;
        remaining -= count < 0 ? -count : count;
        norm[nsym++] = (int16_t)count;
        prev0 = count == 0;
        if (remaining <= 1)
            break;
        while (remaining < threshold) {
            nbits--;
            threshold >>= 1;
        }
    }
#undef PEEK
    if (remaining != 1 || nsym > max_symbol + 1)
        return -1;
    *used = (bitpos + 7) >> 3;
    return fse_build(t, norm, nsym, log);
}

/* ---------------------------------------------------------------- Huffman (RFC 4.2) */

typedef struct {
    uint8_t symbol[1 << HUF_MAX_LOG];
    uint8_t bits[1 << HUF_MAX_LOG];
    unsigned log;
    int ready;
} HufTable;

static int huf_build(HufTable *h, const uint8_t *weights, unsigned n) {
    /* n weights given; the last symbol's weight is implied (RFC 4.2.1.3). */
    uint32_t total = 0;
    for (unsigned s = 0; s < n; s++) {
        if (weights[s] > HUF_MAX_LOG)
            return -1;
        if (weights[s])
            total += 1u << (weights[s] - 1);
    }
    if (total == 0 || n > 255)
        return -1;
    unsigned maxbits = 32 - (unsigned)__builtin_clz(total);
    if (maxbits > HUF_MAX_LOG)
        return -1;
    uint32_t rest = (1u << maxbits) - total;
    if (rest & (rest - 1))
        return -1;
    uint8_t w[256];
    memcpy(w, weights, n);
    w[n] = (uint8_t)(32 - __builtin_clz(rest));
    unsigned nsym = n + 1, counts[HUF_MAX_LOG + 2] = {0}, start[HUF_MAX_LOG + 2];
    for (unsigned s = 0; s < nsym; s++)
        counts[w[s]]++;
    /* Max_Number_of_Bits is the longest code, so weight 1 (codes that long) comes in pairs: a
     * tree without them is refused, as libzstd does (HUF_readStats: rankStats[1] < 2). Weights
     * summing to 2^maxbits already make their number even. */
    if (counts[1] < 2)
        return -1;
    unsigned next = 0;
    for (unsigned k = 1; k <= maxbits; k++) {
        start[k] = next;
        next += counts[k] << (k - 1);
    }
    if (next != 1u << maxbits)
        return -1;
    for (unsigned s = 0; s < nsym; s++) {
        if (!w[s])
            continue;
        unsigned len = 1u << (w[s] - 1);
        for (unsigned k = start[w[s]]; k < start[w[s]] + len; k++) {
            h->symbol[k] = (uint8_t)s;
            h->bits[k] = (uint8_t)(maxbits + 1 - w[s]);
        }
        start[w[s]] += len;
    }
    h->log = maxbits;
    h->ready = 1;
    return 0;
}

static int huf_read_table(HufTable *h, const uint8_t *src, size_t len, size_t *used) {
    if (len < 1)
        return -1;
    unsigned hb = src[0];
    uint8_t w[256];
    unsigned n = 0;
    if (hb >= 128) {
        n = hb - 127;
        size_t bytes = (n + 1) / 2;
        if (1 + bytes > len)
            return -1;
        for (unsigned k = 0; k < n; k++)
            w[k] = (k & 1) ? src[1 + k / 2] & 15 : src[1 + k / 2] >> 4;
        *used = 1 + bytes;
        return huf_build(h, w, n);
    }
    if (hb == 0 || 1 + (size_t)hb > len)
        return -1;
    FseTable t;
    size_t tused;
    if (fse_read_table(&t, src + 1, hb, &tused, HUF_WEIGHTS_MAX_LOG, 255) < 0 || tused >= hb)
        return -1;
    BackBits b;
    if (back_init(&b, src + 1 + tused, hb - tused) < 0)
        return -1;
    unsigned s1 = back_read(&b, t.log), s2 = back_read(&b, t.log);
    if (b.pos < 0)
        return -1;
    for (;;) {
        if (n >= 255)
            return -1;
        w[n++] = t.cell[s1].symbol;
        s1 = t.cell[s1].base + back_read(&b, t.cell[s1].bits);
        if (b.pos < 0) {
            w[n++] = t.cell[s2].symbol;
            break;
        }
        if (n >= 255)
            return -1;
        w[n++] = t.cell[s2].symbol;
        s2 = t.cell[s2].base + back_read(&b, t.cell[s2].bits);
        if (b.pos < 0) {
            if (n >= 255)
                return -1;
            w[n++] = t.cell[s1].symbol;
            break;
        }
    }
    *used = 1 + hb;
    return huf_build(h, w, n);
}

static int huf_stream(const HufTable *h, const uint8_t *src, size_t len, uint8_t *dst, size_t count) {
    BackBits b;
    if (back_init(&b, src, len) < 0)
        return -1;
    unsigned log = h->log;
    for (size_t k = 0; k < count; k++) {
        unsigned at = back_peek(&b, log);
        dst[k] = h->symbol[at];
        b.pos -= h->bits[at];
        if (b.pos < 0)
            return -1;
    }
    return b.pos == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- sequences (RFC 3.1.1.3.2) */

static const uint32_t LL_BASE[36] = {0,  1,  2,  3,  4,  5,   6,   7,   8,   9,    10,   11,
                                     12, 13, 14, 15, 16, 18,  20,  22,  24,  28,   32,   40,
                                     48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
static const uint8_t LL_BITS[36] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1,
                                    1, 1, 2, 2, 3, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint32_t ML_BASE[53] = {3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                     21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 37, 39, 41,
                                     43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387,
                                     32771, 65539};
static const uint8_t ML_BITS[53] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1,
                                    2, 2, 3, 3, 4, 4, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const int16_t LL_DEFAULT[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                       2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
static const int16_t ML_DEFAULT[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
static const int16_t OF_DEFAULT[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

typedef struct {
    FseTable ll, of, ml;
    HufTable huf;
    uint32_t rep[3];
} FrameState;

/* The only file-scope state that is not const: built once by zi_init() (at import, before any
 * frame exists) and only read after, so frames decoded on different threads share nothing
 * mutable (_zstdindex.c decodes without the GIL). */
static FseTable LL_PREDEFINED, OF_PREDEFINED, ML_PREDEFINED;

static int read_table(FseTable *t, unsigned mode, const uint8_t *src, size_t len, size_t *pos,
                      const FseTable *predefined, unsigned maxlog, unsigned maxsym) {
    switch (mode) {
    case 0:
        memcpy(t->cell, predefined->cell, sizeof(FseCell) << predefined->log);
        t->log = predefined->log;
        t->ready = 1;
        return 0;
    case 1:
        if (*pos >= len || src[*pos] > maxsym)
            return -1;
        fse_rle(t, src[(*pos)++]);
        return 0;
    case 2: {
        size_t used;
        if (fse_read_table(t, src + *pos, len - *pos, &used, maxlog, maxsym) < 0)
            return -1;
        *pos += used;
        return 0;
    }
    default:
        return t->ready ? 0 : -1;
    }
}

/* One compressed block: src[0, len) is its content; `at` its offset in the input (for errors);
 * `out` the output position where it starts. Returns the bytes it regenerates, or -1. */
static int64_t compressed_block(Index *ix, FrameState *st, Fail *f, const uint8_t *src, size_t len, size_t at,
                                uint64_t out, uint64_t block_max) {
    if (len < 1)
        FAIL(f, at, "empty compressed block");
    unsigned b0 = src[0], ltype = b0 & 3, sf = (b0 >> 2) & 3;
    size_t pos, regen;
    uint32_t litbase;
    int lit_rle = 0;
    if (ltype < 2) {
        size_t hl;
        if ((sf & 1) == 0) {
            regen = b0 >> 3;
            hl = 1;
        } else if (sf == 1) {
            if (len < 2)
                FAIL(f, at, "literals header runs past the block");
            regen = (b0 >> 4) + ((size_t)src[1] << 4);
            hl = 2;
        } else {
            if (len < 3)
                FAIL(f, at, "literals header runs past the block");
            regen = (b0 >> 4) + ((size_t)src[1] << 4) + ((size_t)src[2] << 12);
            hl = 3;
        }
        if (regen > block_max)
            FAIL(f, at, "literals larger than a block");
        size_t stored = ltype == 0 ? regen : 1;
        if (hl + stored > len)
            FAIL(f, at, "literals run past the block");
        uint8_t *dst = grow_lits(ix, f, at, stored);
        if (!dst)
            return -1;
        litbase = (uint32_t)(dst - ix->lits);
        if (ltype == 0) {
            memcpy(dst, src + hl, regen);
        } else {
            *dst = src[hl];
            lit_rle = 1;
        }
        pos = hl + stored;
    } else {
        static const unsigned HL[4] = {3, 3, 4, 5}, BITS[4] = {10, 10, 14, 18};
        unsigned hl = HL[sf], bits = BITS[sf];
        if (len < hl)
            FAIL(f, at, "literals header runs past the block");
        uint64_t h = 0;
        for (unsigned k = 0; k < hl; k++)
            h |= (uint64_t)src[k] << (8 * k);
        regen = (size_t)((h >> 4) & ((1u << bits) - 1));
        size_t csize = (size_t)((h >> (4 + bits)) & ((1u << bits) - 1));
        if (regen > block_max)
            FAIL(f, at, "literals larger than a block");
        if (hl + csize > len)
            FAIL(f, at, "compressed literals run past the block");
        const uint8_t *c = src + hl;
        size_t clen = csize;
        if (ltype == 2) {
            size_t used;
            if (huf_read_table(&st->huf, c, clen, &used) < 0)
                FAIL(f, at + hl, "bad Huffman table");
            c += used;
            clen -= used;
        } else if (!st->huf.ready) {
            FAIL(f, at, "treeless literals with no Huffman table before them");
        }
        uint8_t *dst = grow_lits(ix, f, at, regen);
        if (!dst)
            return -1;
        litbase = (uint32_t)(dst - ix->lits);
        if (sf == 0) {
            if (huf_stream(&st->huf, c, clen, dst, regen) < 0)
                FAIL(f, at + hl, "Huffman literals stream is corrupt");
        } else {
            if (clen < 6)
                FAIL(f, at + hl, "jump table runs past the literals");
            size_t s1 = c[0] | (size_t)c[1] << 8, s2 = c[2] | (size_t)c[3] << 8, s3 = c[4] | (size_t)c[5] << 8;
            if (6 + s1 + s2 + s3 > clen)
                FAIL(f, at + hl, "jump table points past the literals");
            /* libzstd refuses four streams for fewer than 6 literals (MIN_LITERALS_FOR_4_STREAMS);
             * from 6 on, three streams of (regen + 3) / 4 never exceed regen. */
            if (regen < 6)
                FAIL(f, at + hl, "too few literals for four streams");
            size_t per = (regen + 3) / 4;
            const uint8_t *p = c + 6;
            size_t lens[4] = {s1, s2, s3, clen - 6 - s1 - s2 - s3};
            size_t counts[4] = {per, per, per, regen - 3 * per};
            for (int k = 0; k < 4; k++) {
                if (huf_stream(&st->huf, p, lens[k], dst, counts[k]) < 0)
                    FAIL(f, at + hl, "Huffman literals stream is corrupt");
                p += lens[k];
                dst += counts[k];
            }
        }
        pos = hl + csize;
    }
    if (ix->nlits > LIT_RLE_FLAG - 1) {
        f->too_large = 1;
        FAIL(f, at, "more literals than the index may address");
    }

    /* Sequences section header. */
    if (pos >= len)
        FAIL(f, at + pos, "sequences header runs past the block");
    size_t nseq;
    unsigned s0 = src[pos];
    if (s0 < 128) {
        nseq = s0;
        pos += 1;
    } else if (s0 < 255) {
        if (pos + 2 > len)
            FAIL(f, at + pos, "sequences header runs past the block");
        nseq = ((size_t)(s0 - 128) << 8) + src[pos + 1];
        pos += 2;
    } else {
        if (pos + 3 > len)
            FAIL(f, at + pos, "sequences header runs past the block");
        nseq = src[pos + 1] + ((size_t)src[pos + 2] << 8) + 0x7F00;
        pos += 3;
    }
    uint64_t produced = 0;
    size_t lp = 0;
#define LIT_REF(k) (lit_rle ? (LIT_RLE_FLAG | litbase) : (uint32_t)(litbase + (k)))
    if (nseq) {
        if (pos >= len)
            FAIL(f, at + pos, "sequences header runs past the block");
        unsigned modes = src[pos++];
        if (modes & 3)
            FAIL(f, at + pos - 1, "reserved bits set in the compression modes");
        if (read_table(&st->ll, modes >> 6, src, len, &pos, &LL_PREDEFINED, LL_MAX_LOG, LL_MAX_SYMBOL) < 0)
            FAIL(f, at + pos, "bad literals-length table");
        if (read_table(&st->of, (modes >> 4) & 3, src, len, &pos, &OF_PREDEFINED, OF_MAX_LOG, OF_MAX_SYMBOL) < 0)
            FAIL(f, at + pos, "bad offsets table");
        if (read_table(&st->ml, (modes >> 2) & 3, src, len, &pos, &ML_PREDEFINED, ML_MAX_LOG, ML_MAX_SYMBOL) < 0)
            FAIL(f, at + pos, "bad match-length table");
        if (pos > len)
            FAIL(f, at + len, "sequence tables run past the block");
        BackBits b;
        if (back_init(&b, src + pos, len - pos) < 0)
            FAIL(f, at + pos, "sequences bitstream has no end mark");
        const FseCell *llc = st->ll.cell, *ofc = st->of.cell, *mlc = st->ml.cell;
        unsigned sl = back_read(&b, st->ll.log), so = back_read(&b, st->of.log), sm = back_read(&b, st->ml.log);
        uint32_t *rep = st->rep;
        for (size_t i = 0; i < nseq; i++) {
            unsigned oc = ofc[so].symbol, lc = llc[sl].symbol, mc = mlc[sm].symbol;
            if (oc > OF_MAX_SYMBOL || lc > LL_MAX_SYMBOL || mc > ML_MAX_SYMBOL)
                FAIL(f, at + pos, "sequence code out of range");
            uint64_t ov = (1ull << oc) + back_read(&b, oc);
            uint32_t ml = ML_BASE[mc] + back_read(&b, ML_BITS[mc]);
            uint32_t ll = LL_BASE[lc] + back_read(&b, LL_BITS[lc]);
            uint64_t off;
            if (ov > 3) {
                off = ov - 3;
                rep[2] = rep[1];
                rep[1] = rep[0];
                rep[0] = (uint32_t)off;
            } else {
                unsigned which = (unsigned)ov - 1 + (ll == 0);
                if (which == 0) {
                    off = rep[0];
                } else {
                    off = which == 3 ? (uint64_t)rep[0] - 1 : rep[which];
                    if (off == 0)
                        FAIL(f, at + pos, "repeat offset of zero");
                    if (which != 1)
                        rep[2] = rep[1];
                    rep[1] = rep[0];
                    rep[0] = (uint32_t)off;
                }
            }
            if (b.pos < 0)
                FAIL(f, at + pos, "sequences bitstream ends early");
            if (ll > regen - lp)
                FAIL(f, at + pos, "sequence takes more literals than the block has");
            uint64_t here = out + produced;
            if (off > here + ll)
                FAIL(f, at + pos, "match offset reaches before the start of the frame");
            produced += (uint64_t)ll + ml;
            if (produced > block_max)
                FAIL(f, at + pos, "block regenerates more than a block may");
            if (push_record(ix, f, at, here, ll, ml, (uint32_t)off, LIT_REF(lp)) < 0)
                return -1;
            lp += ll;
            if (i + 1 < nseq) {
                sl = llc[sl].base + back_read(&b, llc[sl].bits);
                sm = mlc[sm].base + back_read(&b, mlc[sm].bits);
                so = ofc[so].base + back_read(&b, ofc[so].bits);
            }
        }
        if (b.pos != 0)
            FAIL(f, at + pos, "sequences bitstream does not end where it should");
    } else if (pos != len) {
        FAIL(f, at + pos, "bytes after a block with no sequences");
    }
    if (regen > lp) {
        if (produced + (regen - lp) > block_max)
            FAIL(f, at, "block regenerates more than a block may");
        if (push_record(ix, f, at, out + produced, (uint32_t)(regen - lp), 0, 0, LIT_REF(lp)) < 0)
            return -1;
        produced += regen - lp;
    }
#undef LIT_REF
    return (int64_t)produced;
}

/* ---------------------------------------------------------------- frames (RFC 3.1.1) */

/* Extend the table over output [0, out): every record starting before `out` is known then, so its
 * entries are final. Never more than `max` entries (see TABLE_SHIFT); when memory runs out the
 * table just stops growing: lookups past its end search (the same records, more slowly). */
static void table_fill(Index *ix, uint64_t out) {
    if (!ix->n || ix->max > UINT32_MAX)  /* record numbers are 32-bit here */
        return;
    uint64_t want = (out + ((1u << TABLE_SHIFT) - 1)) >> TABLE_SHIFT;
    if (want > ix->max)
        want = ix->max;
    if (want <= ix->ntable)
        return;
    if (want > ix->tablecap) {
        while (ix->tablecap < want &&
               grow_array((void **)&ix->table, &ix->tablecap, sizeof(uint32_t), 4096, ix->max) == 0) {
        }
        if (want > ix->tablecap)
            want = ix->tablecap;
    }
    size_t r = ix->ntable ? ix->table[ix->ntable - 1] : 0;
    for (size_t k = ix->ntable; k < want; k++) {
        uint64_t at = (uint64_t)k << TABLE_SHIFT;
        while (r + 1 < ix->n && ix->rec[r + 1].start <= at)
            r++;
        ix->table[k] = (uint32_t)r;
    }
    if (want > ix->ntable)
        ix->ntable = (size_t)want;
}

/* Memory every array of the index holds now. */
static size_t zi_nbytes(const Index *ix) {
    return ix->cap * sizeof(Record) + ix->samplecap * sizeof(uint64_t) + ix->tablecap * sizeof(uint32_t) +
           ix->litcap;
}

/* Free every array of the index. */
static void zi_release(Index *ix) {
    ZI_FREE(ix->rec);
    ZI_FREE(ix->sample);
    ZI_FREE(ix->table);
    ZI_FREE(ix->lits);
    ix->rec = NULL;
    ix->sample = NULL;
    ix->table = NULL;
    ix->lits = NULL;
    ix->n = ix->cap = ix->nsample = ix->samplecap = ix->ntable = ix->tablecap = ix->nlits = ix->litcap = 0;
}

/* Give back the slack of doubling once no record or literal will be added. */
static void zi_trim(Index *ix) {
    if (ix->cap > ix->n && ix->n) {
        Record *r = ZI_REALLOC(ix->rec, ix->n * sizeof(Record));
        if (r) {
            ix->rec = r;
            ix->cap = ix->n;
        }
    }
    if (ix->litcap > ix->nlits && ix->nlits) {
        uint8_t *p = ZI_REALLOC(ix->lits, ix->nlits);
        if (p) {
            ix->lits = p;
            ix->litcap = ix->nlits;
        }
    }
    if (ix->tablecap > ix->ntable && ix->ntable) {
        uint32_t *t = ZI_REALLOC(ix->table, ix->ntable * sizeof(uint32_t));
        if (t) {
            ix->table = t;
            ix->tablecap = ix->ntable;
        }
    }
}

/* A frame being indexed: decoding goes as far as reads need (zi_extend), as a stream stops early;
 * what no read reaches is never decoded. */
typedef struct {
    Index ix;
    const uint8_t *src;
    size_t len;
    size_t pos;          /* input bytes decoded so far */
    uint64_t out;        /* output bytes indexed so far */
    uint64_t fcs;        /* Frame_Content_Size, when has_fcs */
    uint64_t block_max;
    int has_fcs, checksum, done;
    FrameState st;
    Fail failed;         /* set once decoding failed: every later call fails the same way */
    int has_failed;
} Frame;

/* The frame header (RFC 8878 3.1.1.1). */
static int zi_open(Frame *fr, const uint8_t *src, size_t len) {
    Fail *f = &fr->failed;
    fr->src = src;
    fr->len = len;
    fr->has_failed = 1;  /* until the header holds */
    if (len < 6)
        FAIL(f, len, "input ends inside the zstd frame header");
    if (!(src[0] == 0x28 && src[1] == 0xB5 && src[2] == 0x2F && src[3] == 0xFD))
        FAIL(f, 0, "no zstd frame magic");
    unsigned fhd = src[4];
    unsigned fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1, did = fhd & 3;
    if (fhd & 8)
        FAIL(f, 4, "reserved bit set in the frame header");
    size_t pos = 5;
    uint64_t window = 0;
    if (!single) {
        unsigned wd = src[pos++];
        unsigned exponent = wd >> 3, mantissa = wd & 7;
        /* RFC 8878 3.1.1.1.2 lets a decoder refuse a window it will not hold; libzstd refuses any
         * Window_Log above 31 (ZSTD_WINDOWLOG_MAX), one-shot and streaming alike. The index holds
         * no window, but a frame no zstd decoder reads is not one to read bytes out of. */
        if (exponent + 10 > 31)
            FAIL(f, 5, "window larger than zstd allows");
        uint64_t base = 1ull << (exponent + 10);
        window = base + (base / 8) * mantissa;
    }
    static const unsigned DID[4] = {0, 1, 2, 4}, FCS[4] = {0, 2, 4, 8};
    if (did) {
        /* a dictionary id: the frame needs a dictionary no bundle ships */
        size_t n = DID[did];
        uint64_t id = 0;
        if (pos + n > len)
            FAIL(f, pos, "input ends inside the frame header");
        for (size_t k = 0; k < n; k++)
            id |= (uint64_t)src[pos + k] << (8 * k);
        if (id)
            FAIL(f, pos, "frame needs a dictionary");
        pos += n;
    }
    size_t fcs_len = FCS[fcs_flag];
    if (fcs_flag == 0 && single)
        fcs_len = 1;
    int has_fcs = fcs_len > 0;
    uint64_t fcs = 0;
    if (pos + fcs_len > len)
        FAIL(f, pos, "input ends inside the frame header");
    for (size_t k = 0; k < fcs_len; k++)
        fcs |= (uint64_t)src[pos + k] << (8 * k);
    if (fcs_len == 2)
        fcs += 256;
    pos += fcs_len;
    if (single)
        window = fcs;
    fr->block_max = window < BLOCK_MAX ? window : BLOCK_MAX;
    fr->fcs = fcs;
    fr->has_fcs = has_fcs;
    fr->checksum = checksum;
    fr->pos = pos;
    fr->out = 0;
    fr->done = 0;
    memset(&fr->st, 0, sizeof fr->st);
    fr->st.rep[0] = 1;
    fr->st.rep[1] = 4;
    fr->st.rep[2] = 8;
    fr->has_failed = 0;
    return 0;
}

/* Decode blocks until `upto` output bytes are indexed or the frame ends. */
static int zi_extend(Frame *fr, uint64_t upto) {
    if (fr->has_failed)
        return -1;
    Fail *f = &fr->failed;
    Index *ix = &fr->ix;
    const uint8_t *src = fr->src;
    size_t len = fr->len, pos = fr->pos;
    uint64_t out = fr->out, fcs = fr->fcs, block_max = fr->block_max;
    int has_fcs = fr->has_fcs;
    FrameState *st = &fr->st;
    fr->has_failed = 1;  /* cleared on the way out when nothing failed */
    while (!fr->done && out < upto) {
        if (pos + 3 > len)
            FAIL(f, pos, "input ends inside a block header");
        uint32_t bh = src[pos] | (uint32_t)src[pos + 1] << 8 | (uint32_t)src[pos + 2] << 16;
        size_t at = pos;
        pos += 3;
        unsigned last = bh & 1, type = (bh >> 1) & 3;
        size_t size = bh >> 3;
        if (type == 3)
            FAIL(f, at, "reserved block type");
        if (size > block_max)
            FAIL(f, at, "block larger than the frame allows");
        if (type == 0) {
            if (pos + size > len)
                FAIL(f, pos, "input ends inside a raw block");
            uint8_t *dst = grow_lits(ix, f, at, size);
            if (!dst)
                return -1;
            memcpy(dst, src + pos, size);
            if (push_record(ix, f, at, out, (uint32_t)size, 0, 0, (uint32_t)(dst - ix->lits)) < 0)
                return -1;
            pos += size;
            out += size;
        } else if (type == 1) {
            if (pos + 1 > len)
                FAIL(f, pos, "input ends inside an RLE block");
            if (size) {
                uint8_t *dst = grow_lits(ix, f, at, 1);
                if (!dst)
                    return -1;
                *dst = src[pos];
                if (push_record(ix, f, at, out, 1, (uint32_t)(size - 1), size > 1 ? 1 : 0,
                                (uint32_t)(dst - ix->lits)) < 0)
                    return -1;
            }
            pos += 1;
            out += size;
        } else {
            if (pos + size > len)
                FAIL(f, pos, "input ends inside a compressed block");
            int64_t got = compressed_block(ix, st, f, src + pos, size, pos, out, block_max);
            if (got < 0)
                return -1;
            pos += size;
            out += (uint64_t)got;
        }
        if (ix->nlits > LIT_RLE_FLAG - 1) {
            f->too_large = 1;
            FAIL(f, at, "more literals than the index may address");
        }
        if (has_fcs && out > fcs)
            FAIL(f, at, "frame regenerates more than its header declares");
        fr->pos = pos;
        fr->out = out;
        if (last) {
            if (has_fcs && out != fcs)
                FAIL(f, pos, "frame regenerates less than its header declares");
            if (fr->checksum) {
                if (pos + 4 > len)
                    FAIL(f, pos, "input ends inside the content checksum");
                pos += 4;
            }
            fr->pos = pos;
            fr->done = 1;
        }
    }
    table_fill(ix, out);
    if (fr->done)
        zi_trim(ix);
    fr->has_failed = 0;
    return 0;
}

/* The whole frame at once (fuzzers and tests): open, then every block. */
static inline int index_frame(Frame *fr, const uint8_t *src, size_t len, uint64_t *content, size_t *consumed) {
    if (zi_open(fr, src, len) < 0 || zi_extend(fr, UINT64_MAX) < 0)
        return -1;
    *content = fr->out;
    *consumed = fr->pos;
    return 0;
}

/* ---------------------------------------------------------------- reads */

static size_t find_record(const Index *ix, uint64_t pos) {
    /* the last record with start <= pos: first among every 16th record, then within its 16 */
    size_t lo = 0, hi = ix->nsample;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->sample[mid] <= pos)
            lo = mid;
        else
            hi = mid;
    }
    lo <<= SAMPLE_SHIFT;
    hi = lo + (1u << SAMPLE_SHIFT) < ix->n ? lo + (1u << SAMPLE_SHIFT) : ix->n;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->rec[mid].start <= pos)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The last record with start <= pos, among records lo..hi (rec[lo].start <= pos, and the answer
 * is at most hi): a few steps forward, a binary search when the range is wide. */
static inline size_t find_between(const Index *ix, size_t lo, size_t hi, uint64_t pos) {
    while (hi - lo > 8) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (ix->rec[mid].start <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    while (lo < hi && ix->rec[lo + 1].start <= pos)
        lo++;
    return lo;
}

/* find_record() through the table where it reaches `pos`. */
static inline size_t find_fast(const Index *ix, uint64_t pos) {
    uint64_t k = pos >> TABLE_SHIFT;
    if (k >= ix->ntable)
        return find_record(ix, pos);
    size_t hi = k + 1 < ix->ntable ? ix->table[k + 1] : ix->n - 1;
    return find_between(ix, ix->table[k], hi, pos);
}

/* The last record with start <= pos, knowing rec[r].start <= pos. A piece's continuation starts
 * inside its record or where the next one does, so this takes a step at most (searches if not). */
static inline size_t find_after(const Index *ix, size_t r, uint64_t pos) {
    for (int k = 0; k < 2; k++) {
        if (r + 1 >= ix->n || ix->rec[r + 1].start > pos)
            return r;
        r++;
    }
    return find_fast(ix, pos);
}

#define NO_RECORD SIZE_MAX

typedef struct {
    uint64_t pos;     /* RESOLVE: frame position; REPLICATE: the period */
    uint64_t length;  /* bytes to fill at dst */
    size_t dst;
    size_t rec;       /* RESOLVE: a record starting at or before pos (the continuation of a piece
                       * carries its record: the next one starts at most one record on), or NO_RECORD */
    int replicate;
    int top;          /* RESOLVE: the rest of the request itself, not a match's source */
} Task;

typedef struct {
    Task *task;
    size_t n, cap;
} Stack;

static int push(Stack *s, Task t) {
    if (s->n == s->cap && grow_array((void **)&s->task, &s->cap, sizeof(Task), 64, SIZE_MAX) < 0)
        return -1;
    s->task[s->n++] = t;
    return 0;
}

/* Fill dst[0, length) with the frame's bytes at [pos, pos+length).
 *
 * Each task fills one piece of dst. A literal piece is copied; a match piece stands for the bytes
 * `offset` back, so it becomes a task for those. A match longer than its offset repeats its first
 * `offset` bytes: those are resolved, then a REPLICATE task (pushed below them, so it runs after
 * them and everything they push) copies them over the rest. Pieces never overlap, so the order
 * of RESOLVE tasks does not matter. Every task costs one step of the budget.
 *
 * The request itself is walked front to back by `top` tasks, each pushed first (so run last) by
 * the one before it: when one runs, the stack is otherwise empty and dst[0, filled) is final. A
 * match whose source lies in that prefix is copied from dst instead of being followed back
 * through the frame. Without this, a read costs steps in proportion to how far back each byte's
 * literal lies, counted in matches: 1 MiB of two-letter text from zstd -3 (few literals, long
 * chains of short-offset matches) took 138 M steps to read whole, over budget; now 0.25 M.
 * The prefix is never a pending task's target (those all lie at or after `filled`). */
static int resolve(const Index *ix, uint8_t *dst, uint64_t pos, uint64_t length, int64_t budget,
                   const char **why) {
    *why = "read past the end of the frame";
    if (length == 0)
        return 0;
    /* find_record() needs a position inside the records (their samples, their tiling) */
    if (!ix->n || !ix->nsample)
        return -1;
    const Record *last = &ix->rec[ix->n - 1];
    uint64_t end = last->start + last->lit_len + last->match_len;
    if (pos >= end || length > end - pos)
        return -1;
    Stack s = {NULL, 0, 0};
    int rc = 0;
    size_t filled = 0;
    *why = "out of memory";
    if (push(&s, (Task){pos, length, 0, NO_RECORD, 0, 1}) < 0)
        return -1;
    while (s.n) {
        Task t = s.task[--s.n];
        if (t.replicate) {
            for (uint64_t k = t.pos; k < t.length; k++)
                dst[t.dst + k] = dst[t.dst + k - t.pos];
            continue;
        }
        if (--budget < 0) {
            *why = "match references nest too deep to resolve";
            rc = -1;
            break;
        }
        if (t.top) {
            filled = t.dst;
        } else if (t.pos + t.length > pos && t.pos + t.length <= pos + filled) {
            /* the part from `pos` on was read already; only the part before it (if any) is left */
            uint64_t from = t.pos > pos ? t.pos : pos, skip = from - t.pos;
            memcpy(dst + t.dst + (size_t)skip, dst + (size_t)(from - pos), (size_t)(t.length - skip));
            if (!skip)
                continue;
            t.length = skip;
        }
        size_t ri = t.rec == NO_RECORD ? find_fast(ix, t.pos) : find_after(ix, t.rec, t.pos);
        const Record *r = &ix->rec[ri];
        uint64_t rel = t.pos - r->start, take;
        if (rel < r->lit_len) {
            take = r->lit_len - rel;
            if (take > t.length)
                take = t.length;
            if (r->lit & LIT_RLE_FLAG)
                memset(dst + t.dst, ix->lits[r->lit & ~LIT_RLE_FLAG], (size_t)take);
            else
                memcpy(dst + t.dst, ix->lits + r->lit + rel, (size_t)take);
            if (take < t.length &&
                push(&s, (Task){t.pos + take, t.length - take, t.dst + (size_t)take, ri, 0, t.top}) < 0) {
                rc = -1;
                break;
            }
            continue;
        }
        uint64_t m = rel - r->lit_len, off = r->offset, source = r->start + r->lit_len - off;
        take = r->match_len - m;
        if (take > t.length)
            take = t.length;
        if (take < t.length &&
            push(&s, (Task){t.pos + take, t.length - take, t.dst + (size_t)take, ri, 0, t.top}) < 0) {
            rc = -1;
            break;
        }
        uint64_t phase = m % off, period = take < off ? take : off, head = off - phase;
        if (head > period)
            head = period;
        if ((take > off && push(&s, (Task){off, take, t.dst, NO_RECORD, 1, 0}) < 0) ||
            (period > head &&
             push(&s, (Task){source, period - head, t.dst + (size_t)head, NO_RECORD, 0, 0}) < 0) ||
            push(&s, (Task){source + phase, head, t.dst, NO_RECORD, 0, 0}) < 0) {
            rc = -1;
            break;
        }
    }
    ZI_FREE(s.task);
    return rc;
}

/* Build the predefined tables once, before the first index_frame(). */
static int zi_init(void) {
    return fse_build(&LL_PREDEFINED, LL_DEFAULT, 36, 6) | fse_build(&OF_PREDEFINED, OF_DEFAULT, 29, 5) |
           fse_build(&ML_PREDEFINED, ML_DEFAULT, 53, 6);
}

#endif
