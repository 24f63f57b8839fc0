/* Reductions next to the data (issue #24): count, sum, min and max of one uncompressed
 * Zarr chunk, or of a box of it (the part of an edge chunk inside the array, or the part
 * of a chunk inside a selection). The arguments are a struct spindle_reduce whose data
 * fields are ignored: the chunk is the object this program runs on. Emits the 32 bytes of
 * results (count, sum, min, max); the client merges them across chunks. */
#include "spindle_prog.h"

uint64_t spindle_main(const struct spindle_input *in) {
    if (in->args_len != sizeof(struct spindle_reduce))
        return (uint64_t)-1;
    struct spindle_reduce *r = spindle_alloc(sizeof(struct spindle_reduce));
    const uint64_t *from = (const uint64_t *)in->args;
    uint64_t *to = (uint64_t *)r;
    for (int i = 0; i < (int)(sizeof(struct spindle_reduce) / 8); i++)
        to[i] = from[i];
    r->data = in->data;
    r->data_len = in->data_len;
    spindle_reduce(r);
    spindle_emit(&r->count, 32);
    return r->count;
}
