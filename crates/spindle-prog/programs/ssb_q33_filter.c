#include "spindle_prog.h"
/* SSB Q3.3 over one row group of lineorder, filter offloaded: the same filters as
 * ssb_q33.c (same objects, same arguments, the same vectorised helper calls), but the
 * qualifying rows themselves are emitted (lo_custkey, lo_suppkey, lo_orderdate,
 * lo_revenue: 16 bytes each), for the host to convert dates and aggregate. Returns the
 * number of rows emitted. */
struct q33_args {
    uint32_t date_lo, date_hi;   /* inclusive, yyyymmdd */
    uint32_t year_lo, nyears;
    uint32_t ncust, nsupp;       /* chosen cities of each side */
    uint32_t cust_len, supp_len; /* key spaces: keys 0 (unused) to len - 1 */
    uint32_t cust_n, supp_n;     /* qualifying keys listed after this header */
    /* uint32_t cust[cust_n], supp[supp_n]: key << 8 | 1-based city index */
};

/* A byte per key, 0 or the key's city index, from the listed keys (scratch memory is
 * zeroed, so only they are written). */
static uint8_t *key_table(const uint32_t *keys, uint32_t n, uint32_t len) {
    uint8_t *t = spindle_alloc(len);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = keys[i] >> 8;
        if (k < len) t[k] = (uint8_t)keys[i];
    }
    return t;
}

#define BATCH_ROWS 4096

uint64_t spindle_main(const struct spindle_input *in) {
    const struct q33_args *a = (const struct q33_args *)in->args;
    if (in->n_objects != 4 || in->args_len < sizeof *a) return ~0ULL;
    if (in->args_len < sizeof *a + 4 * ((uint64_t)a->cust_n + a->supp_n)) return ~0ULL;
    const uint32_t *keys = (const uint32_t *)(in->args + sizeof *a);
    const uint8_t *cust_sel = key_table(keys, a->cust_n, a->cust_len);
    const uint8_t *supp_sel = key_table(keys + a->cust_n, a->supp_n, a->supp_len);
    const uint32_t *cust = (const uint32_t *)in->objects[0].data;
    const uint32_t *supp = (const uint32_t *)in->objects[1].data;
    const uint32_t *date = (const uint32_t *)in->objects[2].data;
    const uint32_t *rev = (const uint32_t *)in->objects[3].data;
    uint64_t n = in->objects[0].len / 4;
    for (int k = 1; k < 4; k++)
        if (in->objects[k].len / 4 != n) return ~0ULL;
    uint64_t words = (n + 63) / 64;
    uint64_t *bits = spindle_alloc(words * 8);
    struct spindle_filter f = {cust, n, 4, SPINDLE_IN, (uint64_t)cust_sel, a->cust_len,
                               (uint8_t *)bits, 0};
    uint64_t left = spindle_filter(&f);
    if (left) {
        f.column = supp;
        f.a = (uint64_t)supp_sel;
        f.b = a->supp_len;
        f.and_with = (const uint8_t *)bits;
        left = spindle_filter(&f);
    }
    if (left) {
        f.column = date;
        f.op = SPINDLE_RANGE;
        f.a = a->date_lo;
        f.b = a->date_hi;
        left = spindle_filter(&f);
    }
    uint32_t *out = spindle_alloc(BATCH_ROWS * 16);
    uint64_t kept = 0, batched = 0;
    for (uint64_t w = 0; left && w < words; w++) {
        uint64_t b = bits[w];
        if (!b) continue;
        for (uint64_t j = 0; j < 64; j++) {
            if (!((b >> j) & 1)) continue;
            uint64_t i = w * 64 + j;
            out[batched * 4] = cust[i];
            out[batched * 4 + 1] = supp[i];
            out[batched * 4 + 2] = date[i];
            out[batched * 4 + 3] = rev[i];
            kept++;
            if (++batched == BATCH_ROWS) {
                spindle_emit(out, batched * 16);
                batched = 0;
            }
        }
    }
    if (batched) spindle_emit(out, batched * 16);
    return kept;
}
