/* Build: clang-19 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I src/rocm_audit/formats \
 *   fuzz/zstd_index_fuzz.c -lzstd -o /tmp/zstd_index_fuzz  (python-zstandard's libzstd 1.5.7: -I DIR DIR/libzstd.a from its zstd.c)
 * Run: /tmp/zstd_index_fuzz -rss_limit_mb=2048 -timeout=10 CORPUS SEEDS; ZI_DIVERGE_DIR=dir saves divergences, ZI_RECOMPRESS=1 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_d_forceIgnoreChecksum */
#include <zstd.h>
#include <zstd_errors.h>

#define ZI_MALLOC malloc
#define ZI_REALLOC realloc
#define ZI_FREE free
#include "_zstdindex_core.h"

#define ORACLE_MAX (8u << 20) /* libzstd decodes frames up to this size for comparison */
#define READ_MAX (64u << 10)  /* longest partial read */

static unsigned long n_accept_reject, n_reject_accept, n_budget;
static ZSTD_DCtx *dctx;

static void save(const char *tag, const uint8_t *data, size_t size) {
    const char *dir = getenv("ZI_DIVERGE_DIR");
    if (!dir)
        return;
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < size; k++)
        h = (h ^ data[k]) * 1099511628211ull;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s-%016llx", dir, tag, (unsigned long long)h);
    FILE *fp = fopen(path, "wb");
    if (fp) {
        fwrite(data, 1, size, fp);
        fclose(fp);
    }
}

/* libzstd's verdict on the first frame: 1 decoded (out/outlen set), 0 rejected, -1 not asked. */
static int oracle(const uint8_t *data, size_t size, size_t cap, uint8_t **out, size_t *outlen, size_t *err) {
    size_t fsize = ZSTD_findFrameCompressedSize(data, size);
    if (ZSTD_isError(fsize)) {
        *err = fsize;
        return 0;
    }
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf)
        return -1;
    size_t r = ZSTD_decompressDCtx(dctx, buf, cap, data, fsize);
    if (ZSTD_isError(r)) {
        free(buf);
        *err = r;
        return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall && cap >= ORACLE_MAX ? -1 : 0;
    }
    *out = buf;
    *outlen = r;
    return 1;
}

/* The streaming decoder's verdict (what rocm-audit falls back to): 1 accepts, 0 rejects, -1 not
 * asked. One-shot decoding skips checks streaming makes (raw/RLE block sizes against the window,
 * a compressed block's regenerated size), so a divergence from the one-shot verdict is only
 * reported when streaming agrees with it. A stable output buffer spares the window buffer. */
static int stream_verdict(const uint8_t *data, size_t size, size_t *err) {
    static ZSTD_DStream *ds;
    static uint8_t *sink;
    if (!ds) {
        ds = ZSTD_createDStream();
        sink = malloc(ORACLE_MAX);
        if (!ds || !sink)
            abort();
    }
    ZSTD_DCtx_reset(ds, ZSTD_reset_session_and_parameters);
    ZSTD_DCtx_setParameter(ds, ZSTD_d_windowLogMax, 31);
    ZSTD_DCtx_setParameter(ds, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
    ZSTD_DCtx_setParameter(ds, ZSTD_d_stableOutBuffer, 1);
    ZSTD_inBuffer in = {data, size, 0};
    ZSTD_outBuffer o = {sink, ORACLE_MAX, 0};
    for (;;) {
        size_t before = in.pos, made = o.pos;
        size_t r = ZSTD_decompressStream(ds, &o, &in);
        if (ZSTD_isError(r)) {
            *err = r;
            return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -1 : 0;
        }
        if (r == 0)
            return 1; /* frame complete */
        if (in.pos == before && o.pos == made) {
            if (o.pos == o.size)
                return -1; /* larger than the oracle's buffer */
            *err = (size_t)-ZSTD_error_srcSize_wrong;
            return 0; /* truncated */
        }
    }
}

static int64_t small_budget = -1; /* >= 0: the budget of every read of this input */

static int read_range(const Index *ix, uint64_t content, uint64_t pos, uint64_t len, uint8_t *dst) {
    if (len == 0 || pos >= content)
        return 0;
    if (len > content - pos)
        len = content - pos;
    const char *why = NULL;
    int64_t budget = small_budget >= 0 ? small_budget : (int64_t)(1 << 20) + 64 * (int64_t)len;
    int rc = resolve(ix, dst, pos, len, budget, &why);
    if (rc < 0)
        n_budget++;
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int inited;
    if (!inited) {
        if (zi_init() != 0)
            abort();
        dctx = ZSTD_createDCtx();
        ZSTD_DCtx_setParameter(dctx, ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
        inited = 1;
    }
    if (size == 0)
        return 0;
    uint64_t hash = 1469598103934665603ull;
    for (size_t k = 0; k < size; k++)
        hash = (hash ^ data[k]) * 1099511628211ull;
    /* one input in eight gets small caps and budgets, for the TooLarge paths */
    int tight = hash % 8 == 0;
    Frame fr;
    memset(&fr, 0, sizeof fr);
    Index *ix = &fr.ix;
    ix->max = tight ? 1 + (hash >> 8) % 5000 : 1u << 20;
    ix->maxlits = size * 8 < LIT_RLE_FLAG - 1 ? size * 8 : LIT_RLE_FLAG - 1;
    if (tight)
        ix->maxlits = (hash >> 24) % (ix->maxlits + 1);
    small_budget = tight ? (int64_t)((hash >> 40) % 256) : -1;
    const Fail *f = &fr.failed;
    /* Decode as reads need it (zi_extend), the way the binding does: first up to a point taken
     * from the input, with one read inside what is indexed by then, then the rest. */
    uint8_t *early = NULL;
    uint64_t early_pos = 0, early_len = 0;
    int ok = zi_open(&fr, data, size) == 0;
    if (ok && zi_extend(&fr, (hash >> 12) % (1u << 20)) == 0 && fr.out) {
        early_pos = (hash >> 32) % fr.out;
        early_len = 1 + (hash >> 44) % (fr.out - early_pos < READ_MAX ? fr.out - early_pos : READ_MAX);
        early = malloc((size_t)early_len);
        if (!early)
            abort();
        if (read_range(ix, fr.out, early_pos, early_len, early) < 0) {
            free(early);
            early = NULL;
        }
    }
    ok = ok && zi_extend(&fr, UINT64_MAX) == 0;
    uint64_t content = fr.out;
    size_t consumed = fr.pos;
    if (ok && (consumed > size || !fr.done))
        abort();

    /* the oracle */
    unsigned long long fcs = size >= 4 ? ZSTD_getFrameContentSize(data, size) : ZSTD_CONTENTSIZE_ERROR;
    uint8_t *ref = NULL;
    size_t reflen = 0, err = 0;
    int verdict = -1;
    if (size >= 4 && data[0] == 0x28 && data[1] == 0xB5 && data[2] == 0x2F && data[3] == 0xFD) {
        if (fcs != ZSTD_CONTENTSIZE_ERROR && fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs <= ORACLE_MAX)
            verdict = oracle(data, size, (size_t)fcs, &ref, &reflen, &err);
        else if (fcs == ZSTD_CONTENTSIZE_UNKNOWN && ok && content <= ORACLE_MAX) {
            verdict = oracle(data, size, (size_t)content + 1, &ref, &reflen, &err);
            if (verdict == 0 && ZSTD_getErrorCode(err) == ZSTD_error_dstSize_tooSmall) {
                fprintf(stderr, "MISMATCH: libzstd regenerates more than the index's %llu bytes\n",
                        (unsigned long long)content);
                abort();
            }
        }
        else if (fcs == ZSTD_CONTENTSIZE_UNKNOWN && !ok)
            verdict = oracle(data, size, ORACLE_MAX, &ref, &reflen, &err);
        else if (fcs == ZSTD_CONTENTSIZE_ERROR) {
            ZSTD_frameHeader zfh;
            err = ZSTD_getFrameHeader(&zfh, data, size);
            verdict = ZSTD_isError(err) ? 0 : -1;
        }
    }
    int one_shot = verdict;
    size_t serr = 0;
    if (one_shot >= 0 && ok != one_shot && !(!ok && f->too_large)) {
        int sv = stream_verdict(data, size, &serr);
        if (sv >= 0 && sv != one_shot)
            verdict = -1; /* the two libzstd decoders disagree: streaming is what rocm-audit uses */
    }
    if (ok && verdict == 0) {
        if (n_accept_reject++ < 50)
            fprintf(stderr, "NOTE index accepts, libzstd rejects (%s), %zu bytes\n", ZSTD_getErrorName(err), size);
        save("acc", data, size);
    }
    if (!ok && !f->too_large && verdict == 1) {
        if (n_reject_accept++ < 50)
            fprintf(stderr, "NOTE index rejects (%s at %zu), libzstd accepts, %zu bytes\n", f->reason, f->offset, size);
        save("rej", data, size);
    }
    if (ok && verdict == 1 && reflen != content) {
        fprintf(stderr, "MISMATCH: index content %llu, libzstd %zu\n", (unsigned long long)content, reflen);
        abort();
    }

    if (early && verdict == 1 && memcmp(early, ref + early_pos, (size_t)early_len)) {
        fprintf(stderr, "MISMATCH in a read before the frame was decoded whole\n");
        abort();
    }
    free(early);
    if (ok && content) {
        uint8_t *buf = malloc(READ_MAX);
        if (!buf)
            abort();
        uint64_t h = 0;
        for (size_t k = 0; k < 8 && k < size; k++)
            h = h << 8 | data[size - 1 - k];
        uint64_t ranges[4][2] = {
            {0, READ_MAX},
            {content / 2, 1 + h % READ_MAX},
            {content > READ_MAX ? content - READ_MAX : 0, READ_MAX},
            {h % content, 1 + (h >> 32) % READ_MAX},
        };
        for (int k = 0; k < 4; k++) {
            uint64_t pos = ranges[k][0], len = ranges[k][1];
            if (pos >= content)
                continue;
            if (len > content - pos)
                len = content - pos;
            if (read_range(ix, content, pos, len, buf) == 0 && verdict == 1 && memcmp(buf, ref + pos, len)) {
                fprintf(stderr, "MISMATCH in read [%llu, +%llu)\n", (unsigned long long)pos, (unsigned long long)len);
                abort();
            }
        }
        free(buf);
        if (verdict == 1) {
            uint8_t *all = malloc((size_t)content);
            if (!all)
                abort();
            if (read_range(ix, content, 0, content, all) == 0 && memcmp(all, ref, (size_t)content)) {
                size_t k = 0;
                while (all[k] == ref[k])
                    k++;
                fprintf(stderr, "MISMATCH: whole read differs from libzstd at %zu of %llu\n", k,
                        (unsigned long long)content);
                abort();
            }
            free(all);
        }
    }
    free(ref);
    zi_release(ix);
    return 0;
}

/* ZI_RECOMPRESS=1: one mutation in four decodes the input, mutates its content and compresses it
 * again with random parameters, so that valid frames of every shape reach the oracle. */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max, unsigned seed) {
    static int recompress = -1;
    static ZSTD_CCtx *cctx;
    static uint8_t *content;
    const size_t cap = 256u << 10;
    if (recompress < 0) {
        recompress = getenv("ZI_RECOMPRESS") && atoi(getenv("ZI_RECOMPRESS"));
        cctx = ZSTD_createCCtx();
        content = malloc(cap);
    }
    if (!recompress || seed % 4 || !cctx || !content || !dctx)
        return LLVMFuzzerMutate(data, size, max);
    size_t n = ZSTD_decompressDCtx(dctx, content, cap, data, size);
    if (ZSTD_isError(n)) {
        n = size < cap ? size : cap;
        memcpy(content, data, n);
    }
    n = LLVMFuzzerMutate(content, n, cap);
    unsigned r = seed / 4;
#define PICK(k) (r = r * 1103515245u + 12345u, (r >> 8) % (k))
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, (int)PICK(25) - 5);
    if (PICK(2)) {
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_windowLog, 10 + (int)PICK(15));
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_strategy, 1 + (int)PICK(9));
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_minMatch, 3 + (int)PICK(5));
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_targetLength, (int)PICK(200));
    }
    if (!PICK(4)) {
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_enableLongDistanceMatching, 1);
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_ldmMinMatch, 4 + (int)PICK(60));
    }
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, (int)PICK(2));
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, (int)PICK(2));
    if (!PICK(4))
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_targetCBlockSize, 1340 + (int)PICK(20000));
    if (!PICK(4))
        ZSTD_CCtx_setParameter(cctx, ZSTD_c_literalCompressionMode, 1 + (int)PICK(2));
#undef PICK
    size_t c = ZSTD_compress2(cctx, data, max, content, n);
    if (ZSTD_isError(c))
        return LLVMFuzzerMutate(data, size, max);
    return c;
}

/* Divergence counters, printed when the fuzzer exits. */
__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "zstd_index_fuzz: accept/reject %lu, reject/accept %lu, budget %lu\n", n_accept_reject,
            n_reject_accept, n_budget);
}
