/* Spindle pushdown programs: what a program compiled from C sees (issue #23).
 *
 * Build:   clang -O2 -target bpf -c prog.c -o prog.o   (Debian's clang)
 * Entry:   uint64_t spindle_main(const struct spindle_input *in)
 *
 * A program runs against one object (or a few of one placement group) at a time, on the
 * storage daemon that holds it. It
 * reads the object (mapped read-only: `in->data`, or copied with spindle_read), its
 * arguments (`in->args`), and answers with bytes it emits (spindle_emit) and its return
 * value. Every memory access is checked against the regions it may use (its stack, the
 * read-only object, arguments and constants, and scratch memory from spindle_alloc); it
 * runs under an instruction budget and a memory limit. Global variables that are written
 * (.data, .bss) are not supported: use the stack or spindle_alloc.
 *
 * Helpers are plain external functions; a call to any other external function is refused
 * when the program is loaded.
 */
#ifndef SPINDLE_PROG_H
#define SPINDLE_PROG_H

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;

struct spindle_object {
    const uint8_t *data;   /* the object's bytes (read-only) */
    uint64_t len;
};

struct spindle_input {
    const uint8_t *data;   /* the (first) object's bytes (read-only) */
    uint64_t data_len;
    const uint8_t *args;   /* the call's arguments (read-only) */
    uint64_t args_len;
    /* Every object of the run, the first one included: a run may name up to 16 objects of
     * one placement group (names sharing a placement key, `{key}`). */
    uint64_t n_objects;
    const struct spindle_object *objects;
    /* Which part of its objects the run sees. A whole-object run: part 0 of 1. A
     * shard-local run on an erasure-coded pool (`spindle exec --shards`): data shard
     * `part` of `parts` (the pool's k), i.e. of each object the stripe units part,
     * part + parts, part + 2 * parts, ... of `stripe_unit` bytes each, back to back (the
     * last cut at the object's end). Byte b of a part is byte
     * (b / stripe_unit) * parts * stripe_unit + part * stripe_unit + b % stripe_unit of the
     * object. Columns of one width whose row group is one placement key line up: row i of
     * a part is the same row in every column. */
    uint64_t part;
    uint64_t parts;
    uint64_t stripe_unit;
};

/* Appends `len` bytes to the program's output; 0, or the run stops (output limit). */
extern int64_t spindle_emit(const void *src, uint64_t len);

/* Copies up to `len` bytes of the object from `offset` to `dst`; the bytes copied (fewer at
 * the end of the object). */
extern int64_t spindle_read(uint64_t offset, void *dst, uint64_t len);

/* `len` bytes of zeroed scratch memory, 8-byte aligned; the run stops at the memory
 * limit. */
extern void *spindle_alloc(uint64_t len);

/* Vectorised filters over a column of `n` fixed-width unsigned values (`width` 1, 2, 4 or
 * 8 bytes): sets bit i of `out` (n bits, zeroed first) when value i matches, ANDed with
 * `and_with` if not null; returns the number of matches. */
enum spindle_filter_op {
    SPINDLE_EQ = 0,      /* value == a */
    SPINDLE_RANGE = 1,   /* a <= value <= b */
    SPINDLE_MASK = 2,    /* (value & a) != 0 */
    SPINDLE_IN = 3,      /* value < b && ((const uint8_t *)a)[value] != 0: a semi-join
                            against a byte table of b entries (which keys qualify) */
};
struct spindle_filter {
    const void *column;
    uint64_t n;
    uint64_t width;
    uint64_t op;
    uint64_t a;
    uint64_t b;
    uint8_t *out;
    const uint8_t *and_with;
};
extern int64_t spindle_filter(const struct spindle_filter *f);

/* Count, sum, min and max of the values of an n-dimensional box of a chunk: `shape` values
 * of `dtype` (little-endian, C order: an uncompressed Zarr chunk) at `data`, the box being
 * start[d] <= index[d] < stop[d] for d < ndim (at most 8). Floats sum in double precision
 * and propagate NaN; integers sum with wraparound in 64 bits. The helper writes `count`
 * (also returned), and `sum`, `min`, `max` as the bits of a double (f32, f64), an int64
 * (signed) or a uint64 (unsigned); all 0 when the box is empty. A bad request (an unknown
 * dtype, a box outside the shape, a shape larger than the data) stops the run. */
enum spindle_dtype {
    SPINDLE_F32 = 1, SPINDLE_F64 = 2,
    SPINDLE_I8 = 3, SPINDLE_I16 = 4, SPINDLE_I32 = 5, SPINDLE_I64 = 6,
    SPINDLE_U8 = 7, SPINDLE_U16 = 8, SPINDLE_U32 = 9, SPINDLE_U64 = 10,
};
#define SPINDLE_DIMS_MAX 8
struct spindle_reduce {
    const void *data;
    uint64_t data_len;
    uint64_t dtype;
    uint64_t ndim;
    uint64_t shape[SPINDLE_DIMS_MAX];
    uint64_t start[SPINDLE_DIMS_MAX];
    uint64_t stop[SPINDLE_DIMS_MAX];
    /* results */
    uint64_t count;
    uint64_t sum;
    uint64_t min;
    uint64_t max;
};
extern int64_t spindle_reduce(struct spindle_reduce *r);

/* Decodes the zstd frame(s) of src_len bytes at src into dst (room for dst_cap bytes) and
 * returns the decoded length; a corrupt frame, or one larger than dst_cap, stops the run
 * with the decoder's reason. src and dst must not overlap. */
extern uint64_t spindle_zstd_decompress(const void *src, uint64_t src_len, void *dst,
                                        uint64_t dst_cap);

/* As spindle_zstd_decompress, for one Blosc 1 frame (Zarr's `blosc` codec) with the lz4,
 * lz4hc, zlib or zstd inner codec and any shuffle; a frame of another inner codec
 * (blosclz, snappy) stops the run. */
extern uint64_t spindle_blosc_decompress(const void *src, uint64_t src_len, void *dst,
                                         uint64_t dst_cap);

#endif
