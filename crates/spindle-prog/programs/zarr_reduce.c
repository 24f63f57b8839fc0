/* Reductions next to the data (issue #24): count, sum, min and max of one Zarr chunk,
 * or of a box of it (the part of an edge chunk inside the array, or the part of a chunk
 * inside a selection). The chunks are the objects this program runs on (one, or up to 16
 * of one placement group reduced with the same request: a batch of the client's groups
 * whole chunks that way), each stored raw, zstd-compressed (zarr's `zstd` codec, its
 * default for numbers) or as a Blosc frame (zarr's `blosc` codec, lz4/lz4hc/zlib/zstd
 * inside).
 *
 * Arguments: a struct spindle_reduce (its data fields are ignored), optionally followed by
 * struct zarr_codec. Emits 32 bytes of results (count, sum, min, max) per object, in the
 * run's order; the client merges them across chunks. Returns the values counted. */
#include "spindle_prog.h"

#define CODEC_RAW 0
#define CODEC_ZSTD 1
#define CODEC_BLOSC 2

struct zarr_codec {
    uint64_t codec;
    /* The decoded chunk's length in bytes (for zstd and blosc: the room to decode
     * into). */
    uint64_t decoded_len;
};

uint64_t spindle_main(const struct spindle_input *in) {
    uint64_t base = sizeof(struct spindle_reduce);
    if (in->args_len != base && in->args_len != base + sizeof(struct zarr_codec))
        return (uint64_t)-1;
    const struct zarr_codec *c = 0;
    if (in->args_len > base) {
        c = (const struct zarr_codec *)(in->args + base);
        if (c->codec != CODEC_ZSTD && c->codec != CODEC_BLOSC && c->codec != CODEC_RAW)
            return (uint64_t)-2;
    }
    struct spindle_reduce *r = spindle_alloc(sizeof(struct spindle_reduce));
    void *decoded = 0;
    if (c && c->codec != CODEC_RAW)
        decoded = spindle_alloc(c->decoded_len);
    uint64_t counted = 0;
    for (uint64_t o = 0; o < in->n_objects; o++) {
        const uint64_t *from = (const uint64_t *)in->args;
        uint64_t *to = (uint64_t *)r;
        for (int i = 0; i < (int)(sizeof(struct spindle_reduce) / 8); i++)
            to[i] = from[i];
        r->data = in->objects[o].data;
        r->data_len = in->objects[o].len;
        if (decoded) {
            if (c->codec == CODEC_ZSTD)
                r->data_len = spindle_zstd_decompress(r->data, r->data_len, decoded,
                                                      c->decoded_len);
            else
                r->data_len = spindle_blosc_decompress(r->data, r->data_len, decoded,
                                                       c->decoded_len);
            r->data = decoded;
        }
        spindle_reduce(r);
        spindle_emit(&r->count, 32);
        counted += r->count;
    }
    return counted;
}
